#include "inspect/inspect.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <thread>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "ckpt/format/block_codec.h"
#include "ckpt/format/geometry.h"
#include "ckpt/format/manifest.h"
#include "ckpt/format/status_macros.h"
#include "common/escaped_output.h"
#include "common/json_writer.h"
#include "common/tool_util.h"
#include "storage/checkpoint_dir.h"

namespace ckpt::tools {

using format::ChunkRecord;
using format::EntryRecord;

namespace {

using ops::CompactNumber;
using ops::ValueStats;

bool IsObject(const EntryRecord& e) {
  return e.kind == format::EntryKind::kObject;
}

uint64_t RawBytes(const EntryRecord& e, const ChunkRecord& c) {
  return RegionElements(c.region) * DTypeSize(e.dtype);
}

std::string DTypeText(const EntryRecord& e) {
  return IsObject(e) ? "object" : std::string(DTypeName(e.dtype));
}

std::string CodecText(format::Codec c) {
  return c == format::Codec::kZstd ? "zstd" : "none";
}

std::string Created(int64_t ns) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixNanos(ns),
                          absl::UTCTimeZone());
}

std::string Ratio(double r) { return absl::StrFormat("%.2fx", r); }

// "1 tensor", "2 tensors".
std::string Count(uint64_t n, absl::string_view noun) {
  return absl::StrCat(n, " ", noun, n == 1 ? "" : "s");
}

// Printable metadata value: short printable text as is, else its length.
std::string MetadataValue(const std::string& v) {
  bool printable = v.size() <= 64 &&
                   std::all_of(v.begin(), v.end(),
                               [](char c) { return c >= 0x20 && c < 0x7f; });
  return printable ? v : absl::StrCat("<", v.size(), " bytes>");
}

// Left-aligned columns separated by two spaces, no trailing blanks: row
// `r` of a table whose columns are `width` wide.
void PrintRow(const std::vector<size_t>& width,
              const std::vector<std::string>& r, std::ostream& out) {
  std::string line;
  for (size_t i = 0; i < r.size(); ++i) {
    line += r[i];
    if (i + 1 < r.size()) line.append(width[i] - r[i].size() + 2, ' ');
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  out << line << "\n";
}

void Widen(const std::vector<std::string>& r, std::vector<size_t>* width) {
  width->resize(std::max(width->size(), r.size()), 0);
  for (size_t i = 0; i < r.size(); ++i) {
    (*width)[i] = std::max((*width)[i], r[i].size());
  }
}

// A table of a few rows, held until printed.
class Table {
 public:
  explicit Table(std::vector<std::string> header) {
    rows_.push_back(std::move(header));
  }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print(std::ostream& out) const {
    std::vector<size_t> width;
    for (const auto& r : rows_) Widen(r, &width);
    for (const auto& r : rows_) PrintRow(width, r, out);
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// A table of `n` rows after `header`, row i made by row(i) twice (once to
// size the columns, once to print it) rather than held: a checkpoint may
// list 2^24 entries, whose cells took more memory than the manifest.
void PrintRows(const std::vector<std::string>& header, size_t n,
               absl::FunctionRef<std::vector<std::string>(size_t)> row,
               std::ostream& out) {
  std::vector<size_t> width;
  Widen(header, &width);
  for (size_t i = 0; i < n; ++i) Widen(row(i), &width);
  PrintRow(width, header, out);
  for (size_t i = 0; i < n; ++i) PrintRow(width, row(i), out);
}

std::vector<std::string> StatsCells(const EntrySummary& e) {
  if (!e.has_stats) return {"-", "-", "-", "-", "-", "-"};
  const ValueStats& s = e.stats;
  bool any = s.finite > 0;
  return {any ? CompactNumber(s.min) : "-",
          any ? CompactNumber(s.max) : "-",
          any ? CompactNumber(s.mean()) : "-",
          CompactNumber(s.l2()),
          absl::StrCat(s.nan),
          absl::StrCat(s.inf)};
}

nlohmann::ordered_json StatsJson(const ValueStats& s) {
  using json = nlohmann::ordered_json;
  auto num = [](double v) {
    return std::isfinite(v) ? json(v) : json(nullptr);
  };
  bool any = s.finite > 0;
  return json{{"count", s.count},
              {"finite", s.finite},
              {"nan", s.nan},
              {"inf", s.inf},
              {"min", any ? num(s.min) : json(nullptr)},
              {"max", any ? num(s.max) : json(nullptr)},
              {"mean", any ? num(s.mean()) : json(nullptr)},
              {"l2", num(s.l2())}};
}

nlohmann::ordered_json RegionJson(const Region& r) {
  using json = nlohmann::ordered_json;
  if (const Box* b = std::get_if<Box>(&r)) {
    return json{
        {"box",
         {{"offset", std::vector<uint64_t>(b->offset.begin(), b->offset.end())},
          {"size", std::vector<uint64_t>(b->size.begin(), b->size.end())}}}};
  }
  const FlatRange& f = std::get<FlatRange>(r);
  return json{{"flat", {{"start", f.start}, {"length", f.length}}}};
}

}  // namespace

void PrintInspectText(const CheckpointSummary& s, std::ostream& out) {
  const format::Manifest& m = s.manifest;
  Table head({"Checkpoint", s.dir});
  head.Add({"Format",
            absl::StrCat("v", format::kFormatMajor, ".", m.minor_version)});
  head.Add({"Step", absl::StrCat(m.info.step)});
  head.Add({"World size", absl::StrCat(m.info.world_size)});
  head.Add({"Created", Created(m.info.created_unix_ns)});
  head.Add({"Writer", EscapeText(m.info.writer)});
  head.Add({"Checkpoint id", format::IdToHex(m.info.id)});
  head.Add({"Entries",
            absl::StrCat(m.entries.size(), " (", Count(s.tensors, "tensor"),
                         ", ", Count(s.objects, "object"), ") in ",
                         Count(s.chunks, "chunk"))});
  head.Add({"Logical size", absl::StrCat(HumanBytes(s.logical_bytes), " (",
                                         s.logical_bytes, " bytes)")});
  head.Add({"Stored size", absl::StrCat(HumanBytes(s.stored_bytes), " (",
                                        s.stored_bytes, " bytes)")});
  head.Add({"Compression", Ratio(s.compression_ratio())});
  for (const auto& [key, value] : m.metadata) {
    head.Add({"Metadata",
              absl::StrCat(EscapeText(key), " = ", MetadataValue(value))});
  }
  head.Print(out);
  out << "\n";
  const bool stats =
      std::any_of(s.entries.begin(), s.entries.end(),
                  [](const EntrySummary& e) { return e.has_stats; });
  std::vector<std::string> header = {"NAME", "DTYPE",  "SHAPE",   "CHUNKS",
                                     "SIZE", "STORED", "SHARDING"};
  if (stats)
    header.insert(header.end(), {"MIN", "MAX", "MEAN", "L2", "NAN", "INF"});
  PrintRows(
      header, s.entries.size(),
      [&](size_t i) {
        const EntrySummary& row = s.entries[i];
        const EntryRecord& e = m.entries[row.index];
        std::vector<std::string> cells = {EscapeText(e.name),
                                          DTypeText(e),
                                          ShapeText(e.shape),
                                          absl::StrCat(e.chunks.size()),
                                          HumanBytes(row.logical_bytes),
                                          HumanBytes(row.stored_bytes),
                                          row.sharding};
        if (stats) {
          auto v = StatsCells(row);
          cells.insert(cells.end(), v.begin(), v.end());
        }
        return cells;
      },
      out);
}

void PrintEntryText(const CheckpointSummary& s, size_t index,
                    std::ostream& out) {
  const EntryRecord& e = s.manifest.entries[index];
  const EntrySummary& row = s.entries[index];
  Table head({"Checkpoint",
              absl::StrCat(s.dir, " (step ", s.manifest.info.step, ")")});
  head.Add({"Entry", EscapeText(e.name)});
  head.Add({"Kind", IsObject(e) ? "object" : "tensor"});
  head.Add({"Dtype", std::string(DTypeName(e.dtype))});
  head.Add({"Shape", ShapeText(e.shape)});
  head.Add({"Partial", (e.flags & format::kEntryFlagPartial) ? "yes" : "no"});
  head.Add(
      {"Size", absl::StrCat(HumanBytes(row.logical_bytes), " logical, ",
                            HumanBytes(row.stored_bytes), " stored (",
                            Ratio(row.stored_bytes == 0
                                      ? 1.0
                                      : static_cast<double>(row.raw_bytes) /
                                            row.stored_bytes),
                            ")")});
  head.Add({"Sharding", row.sharding});
  head.Add({"Chunks", absl::StrCat(e.chunks.size())});
  if (row.has_stats) {
    auto v = StatsCells(row);
    head.Add({"Min", v[0]});
    head.Add({"Max", v[1]});
    head.Add({"Mean", v[2]});
    head.Add({"L2 norm", v[3]});
    head.Add({"NaN", v[4]});
    head.Add({"Inf", v[5]});
  }
  head.Print(out);
  if (e.chunks.empty()) return;
  out << "\n";
  std::vector<std::string> files(s.manifest.info.world_size);
  for (const format::ShardInfo& sh : s.manifest.shards)
    files[sh.shard_id] = sh.file_name;
  PrintRows(
      {"CHUNK", "REGION", "ELEMENTS", "SHARD", "FILE", "OFFSET", "STORED",
       "CODEC", "BLOCKS"},
      e.chunks.size(),
      [&](size_t i) -> std::vector<std::string> {
        const ChunkRecord& c = e.chunks[i];
        return {absl::StrCat(i),
                RegionToString(c.region),
                absl::StrCat(RegionElements(c.region)),
                absl::StrCat(c.shard),
                files[c.shard],
                c.stored_length > 0 ? absl::StrCat(c.data_offset) : "-",
                HumanBytes(c.stored_length),
                CodecText(c.codec),
                absl::StrCat(format::NumBlocks(RawBytes(e, c), c.block_size))};
      },
      out);
}

namespace {

// The members of the --json document before "entries".
nlohmann::ordered_json HeadJson(const CheckpointSummary& s) {
  using json = nlohmann::ordered_json;
  const format::Manifest& m = s.manifest;
  json j;
  j["path"] = s.dir;
  j["format_version"] =
      absl::StrCat(format::kFormatMajor, ".", m.minor_version);
  j["step"] = m.info.step;
  j["world_size"] = m.info.world_size;
  j["checkpoint_id"] = format::IdToHex(m.info.id);
  j["created_unix_ns"] = m.info.created_unix_ns;
  j["created"] = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ",
                                  absl::FromUnixNanos(m.info.created_unix_ns),
                                  absl::UTCTimeZone());
  j["writer"] = m.info.writer;
  j["fingerprint"] = format::IdToHex(m.info.fingerprint);
  json meta = json::array();
  for (const auto& [k, v] : m.metadata)
    meta.push_back(json{{"key", k}, {"value", v}});
  j["metadata"] = std::move(meta);
  j["shards"] = m.shards.size();
  j["entry_count"] = m.entries.size();
  j["tensor_count"] = s.tensors;
  j["object_count"] = s.objects;
  j["chunk_count"] = s.chunks;
  j["logical_bytes"] = s.logical_bytes;
  j["raw_bytes"] = s.raw_bytes;
  j["stored_bytes"] = s.stored_bytes;
  j["compression_ratio"] = s.compression_ratio();
  return j;
}

// An element of "entries", without its "chunk_map".
nlohmann::ordered_json EntryJson(const CheckpointSummary& s,
                                 const EntrySummary& row) {
  using json = nlohmann::ordered_json;
  const EntryRecord& e = s.manifest.entries[row.index];
  json x;
  x["name"] = e.name;
  x["kind"] = IsObject(e) ? "object" : "tensor";
  x["dtype"] = std::string(DTypeName(e.dtype));
  x["shape"] = std::vector<uint64_t>(e.shape.begin(), e.shape.end());
  x["partial"] = (e.flags & format::kEntryFlagPartial) != 0;
  x["chunks"] = e.chunks.size();
  x["logical_bytes"] = row.logical_bytes;
  x["stored_bytes"] = row.stored_bytes;
  x["sharding"] = row.sharding;
  if (row.has_stats) x["stats"] = StatsJson(row.stats);
  return x;
}

// An element of "chunk_map": chunk `c` of entry `e`.
nlohmann::ordered_json ChunkJson(const EntryRecord& e, const ChunkRecord& c) {
  nlohmann::ordered_json cj = RegionJson(c.region);
  cj["region_text"] = RegionToString(c.region);
  cj["elements"] = RegionElements(c.region);
  cj["shard"] = c.shard;
  cj["data_offset"] = c.data_offset;
  cj["stored_length"] = c.stored_length;
  cj["codec"] = CodecText(c.codec);
  cj["block_size"] = c.block_size;
  cj["blocks"] = format::NumBlocks(RawBytes(e, c), c.block_size);
  return cj;
}

}  // namespace

nlohmann::ordered_json InspectJson(const CheckpointSummary& s, int64_t only) {
  using json = nlohmann::ordered_json;
  json j = HeadJson(s);
  json entries = json::array();
  for (const EntrySummary& row : s.entries) {
    if (only >= 0 && row.index != static_cast<size_t>(only)) continue;
    json x = EntryJson(s, row);
    if (only >= 0) {
      const EntryRecord& e = s.manifest.entries[row.index];
      json map = json::array();
      for (const ChunkRecord& c : e.chunks) map.push_back(ChunkJson(e, c));
      x["chunk_map"] = std::move(map);
    }
    entries.push_back(std::move(x));
  }
  j["entries"] = std::move(entries);
  return j;
}

void PrintInspectJson(const CheckpointSummary& s, int64_t only,
                      std::ostream& out) {
  JsonWriter w(out);
  w.BeginObject();
  w.Members(HeadJson(s));
  w.BeginArray("entries");
  if (only < 0) {
    for (const EntrySummary& row : s.entries) w.Element(EntryJson(s, row));
  } else {
    const EntryRecord& e = s.manifest.entries[static_cast<size_t>(only)];
    w.BeginObject();
    w.Members(EntryJson(s, s.entries[static_cast<size_t>(only)]));
    w.BeginArray("chunk_map");
    for (const ChunkRecord& c : e.chunks) w.Element(ChunkJson(e, c));
    w.End();
    w.End();
  }
  w.End();
  w.End();
  out << "\n";
}

absl::StatusOr<int> RunInspect(const InspectOptions& o, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(CheckpointSummary s, LoadSummary(o.path, o.storage));
  int64_t entry = -1;
  if (!o.entry.empty()) {
    CKPT_ASSIGN_OR_RETURN(size_t i, s.FindEntry(o.entry));
    entry = static_cast<int64_t>(i);
  }
  if (o.stats) {
    ProgressBars bars(
        [](absl::string_view phase) { return std::string(phase); });
    CKPT_RETURN_IF_ERROR(ops::AddStats(&s, o.entry, o.threads, o.storage,
                                       o.progress ? bars.Callback() : nullptr));
  }
  if (o.json) {
    PrintInspectJson(s, entry, out);
  } else if (entry >= 0) {
    PrintEntryText(s, static_cast<size_t>(entry), out);
  } else {
    PrintInspectText(s, out);
  }
  return kExitOk;
}

}  // namespace ckpt::tools
