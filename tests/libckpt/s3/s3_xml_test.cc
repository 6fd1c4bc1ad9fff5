#include "s3/s3_xml.h"

#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::s3 {
namespace {

using ::ckpt::testing::StatusIs;

// A ListObjectsV2 answer as S3 documents it (namespace, declaration,
// entities in keys).
TEST(Xml, ParsesAListBucketResult) {
  const char* doc = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>bucket</Name>
  <Prefix>run/</Prefix>
  <KeyCount>2</KeyCount>
  <IsTruncated>true</IsTruncated>
  <NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
  <Contents>
    <Key>run/a&amp;b &lt;1&gt;</Key>
    <Size>434234</Size>
    <ETag>&quot;fba9dede5f27731c9771645a39863328&quot;</ETag>
  </Contents>
  <Contents><Key>run/&#xE9;t&#233;</Key><Size>0</Size></Contents>
  <CommonPrefixes><Prefix>run/step-1/</Prefix></CommonPrefixes>
</ListBucketResult>)";
  auto root = ParseXml(doc);
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(root->name, "ListBucketResult");
  EXPECT_EQ(root->ChildText("IsTruncated"), "true");
  EXPECT_EQ(root->ChildText("NextContinuationToken"),
            "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
  auto contents = root->Children("Contents");
  ASSERT_EQ(contents.size(), 2u);
  EXPECT_EQ(contents[0]->ChildText("Key"), "run/a&b <1>");
  EXPECT_EQ(contents[0]->ChildText("ETag"),
            "\"fba9dede5f27731c9771645a39863328\"");
  EXPECT_EQ(contents[1]->ChildText("Key"), "run/\xC3\xA9t\xC3\xA9");
  EXPECT_EQ(root->Child("CommonPrefixes")->ChildText("Prefix"), "run/step-1/");
  EXPECT_EQ(root->ChildText("Missing"), "");
  EXPECT_EQ(root->Child("Missing"), nullptr);
}

TEST(Xml, PrefixesCdataCommentsAndEmptyElements) {
  auto root = ParseXml(
      "<s3:Error a='1' b=\"x>y\"><!-- c --><s3:Code>Slow<![CDATA[<Down>]]>"
      "</s3:Code><Empty/><?pi x?><Message >m</Message ></s3:Error>\n");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(root->name, "Error");
  EXPECT_EQ(root->ChildText("Code"), "Slow<Down>");
  EXPECT_EQ(root->ChildText("Message"), "m");
  ASSERT_NE(root->Child("Empty"), nullptr);
}

TEST(Xml, EscapeRoundTrips) {
  const std::string s = "a&b<c>d\"e'f\tg\nh\ri";
  auto root = ParseXml("<K>" + XmlEscape(s) + "</K>");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(root->text, s);
  EXPECT_EQ(XmlEscape("a<b"), "a&lt;b");
}

// One named test per malformation: each is InvalidArgument with a message
// saying what, never a crash.
TEST(Xml, MalformedDocumentsAreErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "no root element"},
      {"   ", "no root element"},
      {"<a>", "is not closed"},
      {"<a></b>", "does not close"},
      {"<a><b></a></b>", "does not close"},
      {"<a>&bogus;</a>", "unknown entity"},
      {"<a>&#0;</a>", "bad character reference"},
      {"<a>&#xD800;</a>", "bad character reference"},
      {"<a>&#x110000;</a>", "bad character reference"},
      {"<a>&amp</a>", "unterminated entity"},
      {"<a><![CDATA[x</a>", "unterminated CDATA"},
      {"<a><!-- x</a>", "unterminated comment"},
      {"<a b=c></a>", "quoted attribute value"},
      {"<a b='c></a>", "unterminated attribute value"},
      {"<a></a><b></b>", "content after the root element"},
      {"<!DOCTYPE a [<!ENTITY x \"y\">]><a>&x;</a>", "DOCTYPE"},
      {"<a><!ENTITY x \"y\"></a>", "declarations are not accepted"},
      {"<>", "expected a name"},
      {"<a", "unterminated start tag"},
  };
  for (const auto& [doc, what] : cases) {
    EXPECT_THAT(ParseXml(doc),
                StatusIs(absl::StatusCode::kInvalidArgument, what))
        << doc;
  }
}

TEST(Xml, NestingIsBounded) {
  std::string deep;
  for (int i = 0; i < kMaxXmlDepth; ++i) deep += "<a>";
  for (int i = 0; i < kMaxXmlDepth; ++i) deep += "</a>";
  EXPECT_TRUE(ParseXml(deep).ok());
  std::string deeper;
  for (int i = 0; i < 100000; ++i) deeper += "<a>";
  EXPECT_THAT(ParseXml(deeper), StatusIs(absl::StatusCode::kInvalidArgument,
                                         "nested deeper than 64"));
}

// Until a libFuzzer target exists for it (fuzz/ builds format's decoders),
// seeded random damage to a real answer: every result is a document or an
// InvalidArgument, never a crash or an overread (the sanitizer builds run
// this too).
TEST(Xml, DamagedAnswersNeverCrash) {
  const std::string seed =
      "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"x\"><Name>b</Name>"
      "<IsTruncated>false</IsTruncated><Contents><Key>a&amp;b&#x41;</Key>"
      "<Size>1</Size></Contents><CommonPrefixes><Prefix><![CDATA[p/]]>"
      "</Prefix></CommonPrefixes><!-- c --></ListBucketResult>";
  const std::string alphabet = "<>/&;#x![]-?=\"' aZ09\xff";
  std::mt19937 rng(26);
  for (int round = 0; round < 5000; ++round) {
    std::string doc = seed;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !doc.empty(); ++e) {
      const size_t at = rng() % doc.size();
      switch (rng() % 3) {
        case 0:
          doc[at] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          doc.erase(at, 1 + rng() % 8);
          break;
        default:
          doc.insert(at, 1, alphabet[rng() % alphabet.size()]);
      }
    }
    if (rng() % 4 == 0) doc.resize(rng() % (doc.size() + 1));
    auto r = ParseXml(doc);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << doc;
    }
  }
}

}  // namespace
}  // namespace ckpt::s3
