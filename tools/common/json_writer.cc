#include "common/json_writer.h"

#include <string>

#include "common/escaped_output.h"

namespace ckpt::tools {

namespace {

constexpr size_t kIndent = 2;  // JsonText's default

}  // namespace

// A newline and the indentation of a line inside the open containers.
void JsonWriter::NewLine(std::string* text) const {
  text->push_back('\n');
  text->append(open_.size() * kIndent, ' ');
}

// As nlohmann::json's pretty printer: "[\n" before the first element,
// ",\n" between elements, each on its own line at the container's depth.
void JsonWriter::Next() {
  if (open_.empty()) return;
  Open& o = open_.back();
  std::string text = o.empty ? "" : ",";
  o.empty = false;
  NewLine(&text);
  out_ << text;
}

void JsonWriter::Key(absl::string_view key) {
  Next();
  out_ << JsonText(nlohmann::ordered_json(std::string(key))) << ": ";
}

void JsonWriter::Begin(char open, char close) {
  out_.put(open);
  open_.push_back({close, true});
}

void JsonWriter::BeginObject() {
  Next();
  Begin('{', '}');
}

void JsonWriter::BeginObject(absl::string_view key) {
  Key(key);
  Begin('{', '}');
}

void JsonWriter::BeginArray(absl::string_view key) {
  Key(key);
  Begin('[', ']');
}

// An empty container is "{}" or "[]"; otherwise its closing bracket is on
// a line of its own, at the depth of its opening line.
void JsonWriter::End() {
  const Open o = open_.back();
  open_.pop_back();
  std::string text;
  if (!o.empty) NewLine(&text);
  text.push_back(o.close);
  out_ << text;
}

// JSON escapes every newline inside a string, so each newline of the dump
// starts a line of its structure, which sits as deep as the value. Written
// at once: the stream's buffer may take each write separately.
void JsonWriter::Value(const nlohmann::ordered_json& value) {
  const std::string dump = JsonText(value);
  std::string text;
  text.reserve(dump.size() + dump.size() / 4);
  size_t start = 0;
  for (size_t nl; (nl = dump.find('\n', start)) != std::string::npos;
       start = nl + 1) {
    text.append(dump, start, nl - start);
    NewLine(&text);
  }
  text.append(dump, start, std::string::npos);
  out_ << text;
}

void JsonWriter::Member(absl::string_view key,
                        const nlohmann::ordered_json& value) {
  Key(key);
  Value(value);
}

void JsonWriter::Members(const nlohmann::ordered_json& object) {
  for (const auto& [key, value] : object.items()) Member(key, value);
}

void JsonWriter::Element(const nlohmann::ordered_json& value) {
  Next();
  Value(value);
}

}  // namespace ckpt::tools
