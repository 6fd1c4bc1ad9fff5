#include "diff/foreign_diff.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/interop/io/dcp_import.h"
#include "ckpt/interop/io/foreign.h"
#include "ckpt/interop/io/safetensors_import.h"
#include "diff/diff.h"

namespace ckpt::tools {
namespace fs = std::filesystem;
namespace {

using interop::FormatWord;
using interop::InputFormat;

// A foreign input converted into a temporary checkpoint root, removed on
// destruction.
class TempConversion {
 public:
  static absl::StatusOr<std::unique_ptr<TempConversion>> Make(
      const std::string& path, InputFormat f) {
    std::error_code ec;
    const fs::path tmp = fs::temp_directory_path(ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("no temporary directory for the conversion of ", path,
                       ": ", ec.message(), " (TMPDIR)"));
    }
    std::string tmpl = (tmp / "ckpt-diff-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          tmpl,
          ": cannot create a temporary directory: ", std::strerror(errno)));
    }
    auto t = std::unique_ptr<TempConversion>(new TempConversion(tmpl));
    const std::string root = (fs::path(tmpl) / "ckpt").string();
    if (f == InputFormat::kDcp) {
      CKPT_RETURN_IF_ERROR(interop::ImportDcp(path, root, {}).status());
    } else {
      CKPT_RETURN_IF_ERROR(interop::ImportSafetensors(path, root, {}).status());
    }
    t->root_ = root;
    return t;
  }
  ~TempConversion() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& root() const { return root_; }
  const std::string& dir() const { return dir_; }

 private:
  explicit TempConversion(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_, root_;
};

}  // namespace

absl::StatusOr<int> RunDiffAnyFormat(const DiffOptions& o, bool json,
                                     std::ostream& out) {
  const InputFormat fa = interop::DetectFormat(o.a),
                    fb = interop::DetectFormat(o.b);
  if (fa == InputFormat::kCkpt && fb == InputFormat::kCkpt)
    return RunDiff(o, json, out);
  DiffOptions d = o;
  std::unique_ptr<TempConversion> ta, tb;
  if (fa != InputFormat::kCkpt) {
    CKPT_ASSIGN_OR_RETURN(ta, TempConversion::Make(o.a, fa));
    d.a = ta->root();
  }
  if (fb != InputFormat::kCkpt) {
    CKPT_ASSIGN_OR_RETURN(tb, TempConversion::Make(o.b, fb));
    d.b = tb->root();
  }
  std::ostringstream text;
  CKPT_ASSIGN_OR_RETURN(int code, RunDiff(d, json, text));
  // The temporary directories become the paths the user gave.
  std::string s = text.str();
  for (const auto* t : {ta.get(), tb.get()}) {
    if (t == nullptr) continue;
    const std::string original = t == ta.get() ? o.a : o.b;
    const InputFormat f = t == ta.get() ? fa : fb;
    // "<tmp>/ckpt/step-N" -> "<original> [dcp]"
    size_t pos;
    while ((pos = s.find(t->root())) != std::string::npos) {
      size_t end = pos + t->root().size();
      if (s.compare(end, 6, "/step-") == 0) end += 6 + 8;
      s.replace(pos, end - pos,
                absl::StrCat(original, " [", FormatWord(f), "]"));
    }
  }
  out << s;
  return code;
}

}  // namespace ckpt::tools
