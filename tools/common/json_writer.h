// JSON output written as it is made: a document whose large arrays (a
// checkpoint's entries, an entry's chunks) are written one element at a
// time, so that the memory taken by output is that of one element rather
// than of the whole document (issue 28, SECURITY.md "Resource use").
//
//   JsonWriter w(out);
//   w.BeginObject();
//   w.Members(head);  // an ordered_json object: its members, in order
//   w.BeginArray("entries");
//   for (...) w.Element(EntryJson(...));
//   w.End();
//   w.End();
//   out << "\n";
//
// The text is byte for byte what JsonText(doc) (escaped_output.h, indent 2)
// gives for the same document held whole: ASCII only, invalid UTF-8
// replaced, never an exception.
#ifndef CKPT_TOOLS_COMMON_JSON_WRITER_H_
#define CKPT_TOOLS_COMMON_JSON_WRITER_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ckpt::tools {

// Writes one JSON document to `out` (not owned; must outlive this). The
// calls must make a well-formed document: a member (Member, Members, or a
// container begun with a key) only inside an object, an element only inside
// an array or as the document itself, and one End per container begun.
// Thread-compatible.
class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}
  JsonWriter(const JsonWriter&) = delete;
  JsonWriter& operator=(const JsonWriter&) = delete;

  // Begins an object that is an element (or the document); its members
  // follow until End.
  void BeginObject();
  // Begins an object or an array that is the value of member `key`.
  void BeginObject(absl::string_view key);
  void BeginArray(absl::string_view key);
  // Ends the innermost object or array begun.
  void End();

  // The member `key`: `value` of the open object.
  void Member(absl::string_view key, const nlohmann::ordered_json& value);
  // Every member of `object` (an object), in its order.
  void Members(const nlohmann::ordered_json& object);
  // `value` as the next element of the open array.
  void Element(const nlohmann::ordered_json& value);

 private:
  struct Open {
    char close;  // '}' or ']'
    bool empty;  // nothing written in it yet
  };
  // Starts the next member or element of the innermost open container.
  void Next();
  void Key(absl::string_view key);
  void Begin(char open, char close);
  // `value` dumped, its lines after the first indented to the depth.
  void Value(const nlohmann::ordered_json& value);
  void NewLine(std::string* text) const;

  std::ostream& out_;
  std::vector<Open> open_;
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_COMMON_JSON_WRITER_H_
