#include <sstream>

#include "common/escaped_output.h"
#include "common/json_writer.h"
#include "common/tool_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ckpt::tools {
namespace {

TEST(HumanBytes, UnitsAndRounding) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1024), "1.00 KiB");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(12ull << 20), "12.0 MiB");
  EXPECT_EQ(HumanBytes(123ull << 30), "123 GiB");
  EXPECT_EQ(HumanBytes(1023ull << 20), "1.00 GiB");
  EXPECT_EQ(HumanBytes(~0ull), "16.0 EiB");
}

TEST(VersionText, NamesToolLibraryAndFormat) {
  std::string v = VersionText("ckpt-x");
  EXPECT_EQ(v.rfind("ckpt-x ", 0), 0u);
  EXPECT_NE(v.find("format v1.0"), std::string::npos);
}

TEST(ShapeText, Formats) {
  EXPECT_EQ(ShapeText(std::vector<int>{}), "[]");
  EXPECT_EQ(ShapeText(std::vector<int>{4, 5}), "[4, 5]");
}

// What a stream behind an EscapingStreambuf writes: lines escaped whole,
// newlines and tabs kept, the unfinished line held until FlushAll.
TEST(EscapingStreambuf, EscapesControlBytesOfEachLineKeepingLineBreaks) {
  std::ostringstream target;
  {
    EscapingStreambuf buffer(target.rdbuf());
    std::ostream out(&buffer);
    out << "a\tb\x1b[2J\n"
        << "c\xc2\x9b"
        << "d\xff\n";
    out.put('\x07');
    out << "e";
    out.flush();
    EXPECT_EQ(target.str(), "a\tb\\x1b[2J\nc\\u009bd\\xff\n");
  }
  EXPECT_EQ(target.str(), "a\tb\\x1b[2J\nc\\u009bd\\xff\n\\x07e");
}

// A UTF-8 character written in two pieces, with a flush between them, is
// kept whole (a line is escaped only once it is complete).
TEST(EscapingStreambuf, CharacterSplitAcrossWritesStaysWhole) {
  std::ostringstream target;
  EscapingStreambuf buffer(target.rdbuf());
  std::ostream out(&buffer);
  out << "\xc3";
  out.flush();
  out << "\xa9\n";
  EXPECT_EQ(target.str(), "\xc3\xa9\n");
}

TEST(EscapingStreambuf, ScopedEscapedStreamRestoresTheBuffer) {
  std::ostringstream stream;
  std::ostream& base = stream;  // ostringstream::rdbuf() is its own buffer
  std::streambuf* before = base.rdbuf();
  {
    ScopedEscapedStream scoped(stream);
    EXPECT_NE(base.rdbuf(), before);
    stream << "x\x1b";
  }
  EXPECT_EQ(base.rdbuf(), before);
  EXPECT_EQ(stream.str(), "x\\x1b");
}

// JSON output is ASCII: controls, DEL, C1 and other characters escaped as
// JSON does, invalid UTF-8 replaced, never an exception.
TEST(JsonText, AsciiOnly) {
  nlohmann::ordered_json j;
  j["n"] = std::string("a\x1b\x7f\xc2\x9b\xc3\xa9\xff", 8);
  EXPECT_EQ(JsonText(j, -1),
            "{\"n\":\"a\\u001b\\u007f\\u009b\\u00e9\\ufffd\"}");
}

// JsonWriter writes what JsonText gives for the document held whole: empty
// and nested containers, members after a streamed array, escaped keys and
// values, multi-line elements indented to their depth.
TEST(JsonWriter, SameTextAsJsonText) {
  using json = nlohmann::ordered_json;
  json head = {{"a", 1},
               {"k\x1b\xc3\xa9", std::string("v\n\xff", 3)},
               {"empty_array", json::array()},
               {"empty_object", json::object()},
               {"nested", {{"x", {1, 2}}, {"y", nullptr}}}};
  json element = {{"name", "e"}, {"shape", {4, 8}}, {"stats", {{"n", 2.5}}}};
  json doc = head;
  doc["none"] = json::array();
  doc["items"] = {element, 7, json::array(), json::object(),
                  json{{"head", 1}, {"list", {element, element}}}};
  doc["after"] = json::array({"x"});

  std::ostringstream out;
  JsonWriter w(out);
  w.BeginObject();
  w.Members(head);
  w.BeginArray("none");
  w.End();
  w.BeginArray("items");
  w.Element(element);
  w.Element(7);
  w.Element(json::array());
  w.Element(json::object());
  w.BeginObject();
  w.Member("head", 1);
  w.BeginArray("list");
  w.Element(element);
  w.Element(element);
  w.End();
  w.End();
  w.End();
  w.BeginArray("after");
  w.Element("x");
  w.End();
  w.End();
  EXPECT_EQ(out.str(), JsonText(doc));
}

TEST(JsonWriter, EmptyDocumentObject) {
  std::ostringstream out;
  JsonWriter w(out);
  w.BeginObject();
  w.BeginObject("o");
  w.End();
  w.End();
  EXPECT_EQ(out.str(), JsonText(nlohmann::ordered_json{
                           {"o", nlohmann::ordered_json::object()}}));
}

}  // namespace
}  // namespace ckpt::tools
