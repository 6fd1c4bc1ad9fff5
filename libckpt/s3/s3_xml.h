// The XML of S3's responses (ListBucketResult, Error, ...), read into a
// small element tree, and the escaping of the XML ckpt sends
// (CompleteMultipartUpload, Delete).
//
// Not a general XML parser: enough of XML 1.0 for what S3-compatible
// servers send (the prolog, elements, attributes, which are skipped,
// character and entity references, CDATA, comments and processing
// instructions). A DOCTYPE is refused, so no entity is ever defined or
// expanded. Namespace prefixes are dropped from names. Input is bytes from
// the network: every malformation is an error, never a crash; nesting is
// bounded (kMaxXmlDepth).
#ifndef CKPT_S3_S3_XML_H_
#define CKPT_S3_S3_XML_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::s3 {

inline constexpr int kMaxXmlDepth = 64;

struct XmlElement {
  std::string name;  // local name: "Key" for <Key> and <s3:Key>
  std::string text;  // character data directly inside, entities decoded
  std::vector<XmlElement> children;

  // The first child named `name`, or null.
  const XmlElement* Child(absl::string_view name) const;
  // The text of the first child named `name`; empty if there is none.
  std::string ChildText(absl::string_view name) const;
  // Every child named `name`, in document order.
  std::vector<const XmlElement*> Children(absl::string_view name) const;
};

// Parses one document. InvalidArgument (naming the byte offset) on
// malformed input.
[[nodiscard]] absl::StatusOr<XmlElement> ParseXml(absl::string_view doc);

// `s` with & < > " ' as entity references, for element text and attribute
// values. Control characters other than tab, LF and CR have no XML 1.0
// form; they are written as character references (XML 1.1), which a
// strict XML 1.0 server may refuse. ckpt's object names never hold them.
std::string XmlEscape(absl::string_view s);

}  // namespace ckpt::s3

#endif  // CKPT_S3_S3_XML_H_
