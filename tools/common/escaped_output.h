// What the tools print cannot carry terminal control sequences (SECURITY.md
// "Names"). Every string read from a file (an entry name, a metadata key or
// value, the writer string, a foreign tensor name or dtype string) is shown
// through format::EscapeText where it is put into a line of text output or
// an error message; JSON output is ASCII with every other character
// escaped by JSON's own rules (JsonText). On top of that, RunToolMain
// (tool_util.h) passes the whole of stdout through EscapingStreambuf and
// every error message through EscapeText, so that a string that reaches
// the output unescaped still cannot carry a control byte: a last line of
// defence, not the mechanism.
#ifndef CKPT_TOOLS_COMMON_ESCAPED_OUTPUT_H_
#define CKPT_TOOLS_COMMON_ESCAPED_OUTPUT_H_

#include <ostream>
#include <streambuf>
#include <string>

#include "absl/strings/string_view.h"
#include "ckpt/format/names.h"

namespace ckpt::tools {

using ::ckpt::format::EscapeText;
using ::ckpt::format::LineBreaks;

// `j` (an nlohmann::json or ordered_json) as JSON text, indented by
// `indent` (-1: on one line), in ASCII only: control characters, DEL and
// every non-ASCII character are written as \uXXXX escapes, and bytes that
// are not valid UTF-8 are replaced by U+FFFD. Never throws.
template <typename Json>
std::string JsonText(const Json& j, int indent = 2) {
  return j.dump(indent, ' ', /*ensure_ascii=*/true,
                Json::error_handler_t::replace);
}

// A stream buffer that writes what it is given to `target`, a whole line
// at a time, through EscapeText(line, LineBreaks::kKeep): newlines and tabs
// pass, every other control byte, C1 control and invalid UTF-8 byte is
// escaped. A line is held until its newline, a flush of the stream writes
// the complete lines, and FlushAll (or the destructor) writes the rest.
// `target` is not owned and must outlive this. Thread-compatible.
class EscapingStreambuf : public std::streambuf {
 public:
  explicit EscapingStreambuf(std::streambuf* target) : target_(target) {}
  ~EscapingStreambuf() override { FlushAll(); }
  EscapingStreambuf(const EscapingStreambuf&) = delete;
  EscapingStreambuf& operator=(const EscapingStreambuf&) = delete;

  std::streambuf* target() const { return target_; }
  // Writes what is held, the last line without its newline too.
  void FlushAll();

 protected:
  int_type overflow(int_type ch) override;
  std::streamsize xsputn(const char* s, std::streamsize n) override;
  int sync() override;

 private:
  // Writes the held text up to its last newline.
  void WriteLines();
  void Write(absl::string_view text);

  std::streambuf* target_;
  std::string held_;
};

// For its lifetime, `stream` (std::cout in a tool's main) writes through
// an EscapingStreambuf; the destructor flushes and restores the stream's
// buffer.
class ScopedEscapedStream {
 public:
  explicit ScopedEscapedStream(std::ostream& stream);
  ~ScopedEscapedStream();
  ScopedEscapedStream(const ScopedEscapedStream&) = delete;
  ScopedEscapedStream& operator=(const ScopedEscapedStream&) = delete;

 private:
  std::ostream& stream_;
  EscapingStreambuf buffer_;
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_COMMON_ESCAPED_OUTPUT_H_
