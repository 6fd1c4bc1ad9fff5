#include "common/diff_report.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "common/escaped_output.h"
#include "common/tool_util.h"

namespace ckpt::tools {
namespace {

using ops::DiffNote;
using ops::DiffReport;
using ops::StructuralDiff;
using ops::ValueDiff;

std::string FormatDiff(double d) {
  if (std::isinf(d)) return "inf";
  return absl::StrFormat("%g", d);
}

// "A: PATH (step S, N ranks, E entries)".
void PrintSide(const char* label, const ops::DiffSide& s, std::ostream& out) {
  out << label << ": " << s.path << " (step " << s.step << ", " << s.world_size
      << (s.world_size == 1 ? " rank, " : " ranks, ") << s.entries
      << (s.entries == 1 ? " entry)\n" : " entries)\n");
}

void PrintStructural(const std::vector<StructuralDiff>& structural,
                     std::ostream& out) {
  out << "structural differences: " << structural.size() << "\n";
  for (const StructuralDiff& s : structural) {
    out << "  " << absl::StrFormat("%-9s", s.change) << EscapeText(s.entry);
    if (s.change == "removed") {
      out << " (only in A)";
    } else if (s.change == "added") {
      out << " (only in B)";
    } else if (s.change == "coverage") {
      out << ": chunks cover different elements (" << s.a << " in A, " << s.b
          << " in B)";
    } else {
      out << ": " << EscapeText(s.a) << " in A, " << EscapeText(s.b) << " in B";
    }
    out << "\n";
  }
}

void PrintValues(const DiffReport& r, std::ostream& out) {
  out << "value differences: " << r.values.size() << " of "
      << r.entries_compared << " entries compared\n";
  for (const ValueDiff& v : r.values) {
    out << "  " << EscapeText(v.entry) << ": ";
    if (v.object) {
      out << "object, " << v.differing << " of " << v.total << " bytes differ ("
          << HumanBytes(v.size_a) << " in A, " << HumanBytes(v.size_b)
          << " in B)\n";
    } else {
      out << v.differing << " of " << v.total
          << " elements differ, max abs diff " << FormatDiff(v.max_abs_diff)
          << ", first at " << ShapeText(v.first_at) << ": " << v.first_a
          << " in A, " << v.first_b << " in B\n";
    }
  }
}

void PrintResult(const DiffReport& r, std::ostream& out) {
  if (r.equal()) {
    out << "result: equal (" << r.entries_compared
        << (r.entries_compared == 1 ? " entry, " : " entries, ")
        << HumanBytes(r.bytes_compared) << " compared)\n";
  } else {
    out << "result: different (" << r.structural.size() << " structural, "
        << r.values.size()
        << (r.values.size() == 1 ? " value difference)\n"
                                 : " value differences)\n");
  }
}

}  // namespace

void PrintDiffText(const DiffReport& r, std::ostream& out) {
  PrintSide("A", r.a, out);
  PrintSide("B", r.b, out);
  if (!r.tolerance.exact()) {
    out << "tolerance: atol " << absl::StrFormat("%g", r.tolerance.atol)
        << ", rtol " << absl::StrFormat("%g", r.tolerance.rtol) << "\n";
  }
  for (const DiffNote& n : r.notes) {
    out << "note: " << EscapeText(n.what) << ": " << EscapeText(n.a)
        << " in A, " << EscapeText(n.b) << " in B\n";
  }
  if (!r.structural.empty()) PrintStructural(r.structural, out);
  if (!r.values.empty()) PrintValues(r, out);
  PrintResult(r, out);
}

nlohmann::ordered_json DiffToJson(const DiffReport& r) {
  using J = nlohmann::ordered_json;
  auto side = [](const ops::DiffSide& s) {
    J j;
    j["path"] = s.path;
    j["step"] = s.step;
    j["world_size"] = s.world_size;
    j["entries"] = s.entries;
    return j;
  };
  J j;
  j["a"] = side(r.a);
  j["b"] = side(r.b);
  j["atol"] = r.tolerance.atol;
  j["rtol"] = r.tolerance.rtol;
  j["equal"] = r.equal();
  j["notes"] = J::array();
  for (const DiffNote& n : r.notes)
    j["notes"].push_back({{"what", n.what}, {"a", n.a}, {"b", n.b}});
  j["structural"] = J::array();
  for (const StructuralDiff& s : r.structural) {
    J x{{"entry", s.entry}, {"change", s.change}};
    if (s.change != "added" && s.change != "removed") {
      x["a"] = s.a;
      x["b"] = s.b;
    }
    j["structural"].push_back(std::move(x));
  }
  j["values"] = J::array();
  for (const ValueDiff& v : r.values) {
    J x{{"entry", v.entry},
        {"kind", v.object ? "object" : "tensor"},
        {"differing", v.differing},
        {"total", v.total}};
    if (v.object) {
      x["size_a"] = v.size_a;
      x["size_b"] = v.size_b;
    } else {
      if (std::isinf(v.max_abs_diff)) {
        x["max_abs_diff"] = "inf";
      } else {
        x["max_abs_diff"] = v.max_abs_diff;
      }
      x["first_at"] = J::array();
      for (uint64_t c : v.first_at) x["first_at"].push_back(c);
      x["first_a"] = v.first_a;
      x["first_b"] = v.first_b;
    }
    j["values"].push_back(std::move(x));
  }
  j["entries_compared"] = r.entries_compared;
  j["bytes_compared"] = r.bytes_compared;
  return j;
}

}  // namespace ckpt::tools
