// Every tool on checkpoints whose strings are hostile (issue 28 §2,
// SECURITY.md "Names"): the CHECKPOINT_INFO writer, metadata keys and
// values, entry names (C1 controls, which names may hold), safetensors
// tensor names, __metadata__ and a bogus dtype string, DCP item names. The
// text, --json and error outputs of ckpt-inspect, ckpt-validate, ckpt-diff,
// ckpt-reshard, ckpt-convert and ckpt-synth must carry no control byte
// (0x00-0x08, 0x0B-0x1F, 0x7F), no C1 control (UTF-8 0xC2 0x80-0x9F) and
// only valid UTF-8; and a newline in a file's string must not start a line
// of the output.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/names.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "synth/synth.h"
#include "synth/synth_values.h"
#include "testing/cli.h"
#include "testing/files.h"
#include "tools/inspect/fixture.h"

namespace ckpt::tools {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CliResult;
using ::ckpt::testing::ReadFileBytes;
using ::ckpt::testing::WriteFileBytes;
using testing::FixtureSpec;
using testing::FixtureTensor;
using ::testing::HasSubstr;

// OSC title change and clipboard write, screen clear, 8-bit CSI, a line
// break that would forge a line, NUL, DEL and bytes that are not UTF-8.
const std::string kHostile(
    "x\x1b]0;pwned\x07 \x1b[2J\x1b]52;c;aGk=\x07 \xc2\x9b"
    "31m \r\nFORGED\t\x00\x7f\xff\xfe end",
    52);
// Entry names and metadata keys may hold C1 controls, nothing below 0x20.
const std::string kC1Name =
    "layers.0\xc2\x9b"
    "2J.w";
const std::string kC1Key =
    "note\xc2\x9b"
    "31m";

// What the output of a tool must never hold; "" if it holds none of it.
std::string UnsafeBytes(const std::string& s) {
  if (!format::IsValidUtf8(s)) return "invalid UTF-8";
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = s[i];
    if ((c < 0x20 && c != '\t' && c != '\n') || c == 0x7f)
      return absl::StrCat("control byte 0x", absl::Hex(c), " at ", i);
    if (c == 0xc2 && i + 1 < s.size() &&
        static_cast<unsigned char>(s[i + 1]) <= 0x9f) {
      return absl::StrCat("C1 control at ", i);
    }
  }
  for (absl::string_view line : absl::StrSplit(s, '\n')) {
    if (absl::StartsWith(line, "FORGED")) return "a forged line";
  }
  return "";
}

class HostileOutput : public ::testing::Test {
 protected:
  // Runs `bin args...` and checks both its outputs; returns the result.
  CliResult Run(const std::string& bin, const std::vector<std::string>& args) {
    CliResult r = ckpt::testing::RunCli(bin, args, dir_.path());
    std::string command = fs::path(bin).filename().string();
    for (const auto& a : args) absl::StrAppend(&command, " ", a);
    EXPECT_GE(r.exit_code, 0) << command << ": " << r.err;
    EXPECT_LE(r.exit_code, 2) << command << ": " << r.err;
    EXPECT_EQ(UnsafeBytes(r.out), "")
        << absl::CHexEscape(command) << "\nstdout: " << absl::CHexEscape(r.out);
    EXPECT_EQ(UnsafeBytes(r.err), "")
        << absl::CHexEscape(command) << "\nstderr: " << absl::CHexEscape(r.err);
    return r;
  }

  // A checkpoint of two ranks whose writer, metadata and names are
  // hostile, consistent in its manifest and shard indexes (every tool
  // reads it). `variant` changes a value, a metadata value and the set of
  // entries, for ckpt-diff.
  std::string WriteHostileCheckpoint(const std::string& root, int variant) {
    FixtureSpec spec;
    spec.world = 2;
    spec.metadata = {
        {kC1Key, variant == 0 ? kHostile : kHostile + "B"},
        {"plain", kHostile},
        {synth::kMetaVersion,
         variant == 0 ? std::to_string(synth::kValueVersion) : kHostile},
        {synth::kMetaLayout, kHostile},
    };
    FixtureTensor w{kC1Name, DType::kFloat32, {4, 2}};
    w.pieces = testing::Rows(w.shape, 2);
    w.data = testing::Elements<float>(
        8, [&](uint64_t i) { return static_cast<float>(i + variant); });
    spec.tensors.push_back(w);
    FixtureTensor o;
    o.name = variant == 0 ? "rng\xc2\x85only.in.a" : "rng\xc2\x85only.in.b";
    o.object = true;
    o.data = "state";
    o.pieces = {{FlatRange{0, o.data.size()}, 1}};
    spec.tensors.push_back(o);
    spec.edit_index = [](uint32_t, format::ShardIndex* index) {
      index->info.writer = kHostile;
    };
    const std::string dir = testing::WriteCheckpoint(root, spec);
    SetWriter(dir, kHostile);
    return dir;
  }

  // Rewrites the manifest of `dir` with `edit` applied (checksums valid).
  static void EditManifest(const std::string& dir,
                           const std::function<void(format::Manifest&)>& edit) {
    const std::string path = dir + "/MANIFEST";
    auto m = format::DecodeManifest(ReadFileBytes(path));
    ASSERT_TRUE(m.ok()) << m.status();
    edit(*m);
    WriteFileBytes(path, format::EncodeManifest(*m));
  }
  static void SetWriter(const std::string& dir, const std::string& writer) {
    EditManifest(dir, [&](format::Manifest& m) { m.info.writer = writer; });
  }

  // A safetensors file of `header` (JSON) and `data_bytes` zero bytes.
  std::string WriteSafetensors(const std::string& name,
                               const std::string& header, uint64_t data_bytes) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i)
      bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    bytes += header + std::string(data_bytes, '\0');
    const std::string path = dir_ / name;
    WriteFileBytes(path, bytes);
    return path;
  }

  ckpt::testing::TempDir dir_;
};

TEST_F(HostileOutput, CkptCheckpointThroughEveryTool) {
  const std::string a = WriteHostileCheckpoint(dir_ / "a", 0);
  const std::string b = WriteHostileCheckpoint(dir_ / "b", 1);
  CliResult r = Run(CKPT_INSPECT_BIN, {a});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Writer         x\\x1b]0;pwned\\x07 "));
  EXPECT_THAT(r.out, HasSubstr("layers.0\\u009b2J.w"));
  EXPECT_THAT(r.out, HasSubstr("note\\u009b31m = <"));
  Run(CKPT_INSPECT_BIN, {a, "--json"});
  EXPECT_EQ(Run(CKPT_INSPECT_BIN, {a, "--entry", kC1Name}).exit_code, 0);
  EXPECT_EQ(Run(CKPT_INSPECT_BIN, {a, "--stats"}).exit_code, 0);
  r = Run(CKPT_INSPECT_BIN, {a, "--entry", kHostile});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("entry 'x\\x1b]0;pwned"));

  EXPECT_EQ(Run(CKPT_VALIDATE_BIN, {a}).exit_code, 0);
  Run(CKPT_VALIDATE_BIN, {a, "--json"});

  r = Run(CKPT_DIFF_BIN, {a, b});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr("note: metadata 'note\\u009b31m': x\\x1b]0;"));
  EXPECT_THAT(r.out, HasSubstr("rng\\u0085only.in.a (only in A)"));
  EXPECT_THAT(r.out, HasSubstr("  layers.0\\u009b2J.w: 8 of 8 elements"));
  Run(CKPT_DIFF_BIN, {a, b, "--json"});

  r = Run(CKPT_RESHARD_BIN, {a, dir_ / "r1", "--to", "3", "-v", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("  layers.0\\u009b2J.w: float32"));
  Run(CKPT_RESHARD_BIN, {a, dir_ / "r2", "--to", "1", "--json"});

  r = Run(CKPT_CONVERT_BIN, {a, dir_ / "a.h5", "--to", "hdf5", "-v"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  Run(CKPT_CONVERT_BIN, {dir_ / "a.h5", dir_ / "h", "--from", "hdf5", "-v"});
  Run(CKPT_CONVERT_BIN,
      {a, dir_ / "a.safetensors", "--to", "safetensors", "-v"});
  Run(CKPT_CONVERT_BIN, {a, dir_ / "a.json.h5", "--to", "hdf5", "--json"});

  r = Run(CKPT_SYNTH_BIN, {"verify", a});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown layout 'x\\x1b]0;pwned"));
  r = Run(CKPT_SYNTH_BIN, {"verify", b});
  EXPECT_THAT(r.err, HasSubstr("' = 'x\\x1b]0;pwned"));
}

// The error paths of a checkpoint that is not valid: a shard index whose
// writer disagrees with the manifest's, a manifest naming an entry with
// ESC in it.
TEST_F(HostileOutput, CkptErrorsThroughEveryTool) {
  const std::string a = WriteHostileCheckpoint(dir_ / "a", 0);
  SetWriter(a,
            "ckpt \x1b[5m\xc2\x9b"
            "5m\nFORGED");
  CliResult r = Run(CKPT_VALIDATE_BIN, {a});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("writer 'x\\x1b]0;pwned"));
  EXPECT_THAT(r.out, HasSubstr("' != 'ckpt \\x1b[5m\\u009b5m\\x0aFORGED'"));
  Run(CKPT_VALIDATE_BIN, {a, "--json"});
  Run(CKPT_INSPECT_BIN, {a, "--stats"});
  Run(CKPT_DIFF_BIN, {a, a});
  Run(CKPT_RESHARD_BIN, {a, dir_ / "r", "--to", "2"});
  Run(CKPT_CONVERT_BIN, {a, dir_ / "a.h5", "--to", "hdf5"});

  const std::string bad = WriteHostileCheckpoint(dir_ / "bad", 0);
  EditManifest(bad, [](format::Manifest& m) {
    m.entries[0].name = "bad\x1b[2J\nFORGED";
  });
  r = Run(CKPT_VALIDATE_BIN, {bad});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("invalid name 'bad\\x1b[2J\\x0aFORGED'"));
  Run(CKPT_VALIDATE_BIN, {bad, "--json"});
  for (const char* bin : {CKPT_INSPECT_BIN, CKPT_SYNTH_BIN}) {
    std::vector<std::string> args = {bad};
    if (bin == std::string(CKPT_SYNTH_BIN)) args.insert(args.begin(), "verify");
    r = Run(bin, args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("invalid name 'bad\\x1b[2J\\x0aFORGED'"));
  }
  Run(CKPT_DIFF_BIN, {bad, a});
  Run(CKPT_RESHARD_BIN, {bad, dir_ / "r", "--to", "2"});
  Run(CKPT_CONVERT_BIN, {bad, dir_ / "b.safetensors", "--to", "safetensors"});
}

// A valid safetensors file whose tensor names and __metadata__ hold escape
// sequences, and one whose dtype string does.
TEST_F(HostileOutput, SafetensorsThroughEveryTool) {
  const std::string st = WriteSafetensors(
      "h.safetensors",
      R"({"__metadata__":{"note\u001b]0;t\u0007":"v\u001b[2J\u009b\nFORGED)"
      R"(\u0000\u007f"},"w\u001b]52;c;aGk=\u0007\u009b\nFORGED":)"
      R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
      8);
  CliResult r = Run(CKPT_INSPECT_BIN, {st});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("w\\x1b]52;c;aGk=\\x07\\u009b\\x0aFORGED"));
  EXPECT_THAT(r.out, HasSubstr("note\\x1b]0;t\\x07 = v\\x1b[2J\\u009b"));
  Run(CKPT_INSPECT_BIN, {st, "--json"});
  EXPECT_EQ(Run(CKPT_INSPECT_BIN,
                {st, "--entry", "w\x1b]52;c;aGk=\x07\xc2\x9b\nFORGED"})
                .exit_code,
            0);
  EXPECT_EQ(Run(CKPT_VALIDATE_BIN, {st}).exit_code, 0);
  Run(CKPT_VALIDATE_BIN, {st, "--json"});
  Run(CKPT_DIFF_BIN, {st, st});
  r = Run(CKPT_CONVERT_BIN, {st, dir_ / "c", "--from", "safetensors", "-v"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("w\\x1b]52;c;aGk=\\x07\\u009b\\x0aFORGED"));

  const std::string bogus =
      WriteSafetensors("d.safetensors",
                       R"({"x\u001b[1m":{"dtype":"F\u001b[31m32","shape":[1],)"
                       R"("data_offsets":[0,4]}})",
                       4);
  const std::string said = "unknown dtype 'F\\x1b[31m32'";
  r = Run(CKPT_INSPECT_BIN, {bogus});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(said));
  r = Run(CKPT_VALIDATE_BIN, {bogus});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr(said));
  Run(CKPT_VALIDATE_BIN, {bogus, "--json"});
  EXPECT_THAT(Run(CKPT_DIFF_BIN, {bogus, st}).err, HasSubstr(said));
  EXPECT_THAT(
      Run(CKPT_CONVERT_BIN, {bogus, dir_ / "d", "--from", "safetensors"}).err,
      HasSubstr(said));
}

// The DCP fixture of PyTorch 2.13 with a tensor and a bytes item renamed
// (same length, in place in .metadata) to names holding escapes.
TEST_F(HostileOutput, DcpThroughEveryTool) {
  const fs::path d = dir_ / "dcp";
  fs::copy(std::string(CKPT_SOURCE_DIR) + "/tests/data/interop/dcp_torch213", d,
           fs::copy_options::recursive);
  std::string md = ReadFileBytes(d / ".metadata");
  for (const auto& [from, to] :
       std::vector<std::pair<std::string, std::string>>{
           {"model.w_cols", std::string("m\x1b]0;t\x07\xc2\x9bw\x7f\n", 12)},
           {"extra.note.name", std::string("n\x1b[2J\nFORGED\xff\0x", 15)}}) {
    ASSERT_EQ(from.size(), to.size());
    size_t n = 0;
    for (size_t at = md.find(from); at != std::string::npos;
         at = md.find(from, at + 1), ++n) {
      md.replace(at, from.size(), to);
    }
    ASSERT_GT(n, 0u) << from;
  }
  WriteFileBytes(d / ".metadata", md);
  CliResult r = Run(CKPT_INSPECT_BIN, {d});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("m\\x1b]0;t\\x07\\u009bw\\x7f\\x0a"));
  Run(CKPT_INSPECT_BIN, {d, "--json"});
  r = Run(CKPT_VALIDATE_BIN, {d});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("n\\x1b[2J\\x0aFORGED\\xff\\x00"));
  Run(CKPT_VALIDATE_BIN, {d, "--json"});
  Run(CKPT_DIFF_BIN, {d, d});
  r = Run(CKPT_CONVERT_BIN, {d, dir_ / "c", "--from", "dcp", "-v"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("cannot be a ckpt entry"));
}

}  // namespace
}  // namespace ckpt::tools
