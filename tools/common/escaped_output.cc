#include "common/escaped_output.h"

#include <cstring>

namespace ckpt::tools {

void EscapingStreambuf::Write(absl::string_view text) {
  const std::string escaped = EscapeText(text, LineBreaks::kKeep);
  target_->sputn(escaped.data(), static_cast<std::streamsize>(escaped.size()));
}

void EscapingStreambuf::WriteLines() {
  const size_t end = held_.rfind('\n');
  if (end == std::string::npos) return;
  // Whole lines only: a UTF-8 sequence never spans a newline, so none is
  // cut in two (and shown as invalid bytes) by a flush in its middle.
  Write(absl::string_view(held_).substr(0, end + 1));
  held_.erase(0, end + 1);
}

void EscapingStreambuf::FlushAll() {
  WriteLines();
  if (!held_.empty()) Write(held_);
  held_.clear();
  target_->pubsync();
}

EscapingStreambuf::int_type EscapingStreambuf::overflow(int_type ch) {
  if (traits_type::eq_int_type(ch, traits_type::eof()))
    return traits_type::not_eof(ch);
  held_ += traits_type::to_char_type(ch);
  if (ch == '\n') WriteLines();
  return ch;
}

std::streamsize EscapingStreambuf::xsputn(const char* s, std::streamsize n) {
  held_.append(s, static_cast<size_t>(n));
  if (std::memchr(s, '\n', static_cast<size_t>(n)) != nullptr) WriteLines();
  return n;
}

int EscapingStreambuf::sync() {
  WriteLines();
  return target_->pubsync();
}

ScopedEscapedStream::ScopedEscapedStream(std::ostream& stream)
    : stream_(stream), buffer_(stream.rdbuf()) {
  stream_.rdbuf(&buffer_);
}

ScopedEscapedStream::~ScopedEscapedStream() {
  stream_.flush();
  buffer_.FlushAll();
  stream_.rdbuf(buffer_.target());
}

}  // namespace ckpt::tools
