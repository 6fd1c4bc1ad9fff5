// Foreign checkpoints wherever a ckpt checkpoint is accepted: which format a
// path holds (a PyTorch DCP directory, Megatron torch_dist included; a
// safetensors file; a Hugging Face index, file or directory), the names the
// tools give the formats, and the structural validation of a foreign input.
// ckpt-inspect, ckpt-validate and ckpt-diff dispatch on DetectFormat and
// print what these functions find (tools/<tool>/foreign_*.h).
#ifndef CKPT_INTEROP_IO_FOREIGN_H_
#define CKPT_INTEROP_IO_FOREIGN_H_

#include <string>
#include <vector>

namespace ckpt::interop {

struct DcpInput;          // dcp_reader.h
struct SafetensorsInput;  // safetensors_import.h

enum class InputFormat { kCkpt, kSafetensors, kDcp };

// kDcp: a directory holding ".metadata" or the rank-local "__0.metadata";
// kSafetensors: a file named *.safetensors or *.safetensors.index.json, or
// a directory holding an index or one .safetensors file and no MANIFEST or
// `latest`; kCkpt otherwise.
InputFormat DetectFormat(const std::string& path);

// "dcp", "safetensors" or "ckpt": the word of ckpt-convert's --from.
const char* FormatWord(InputFormat f);

// "PyTorch DCP (torch.distributed.checkpoint.metadata)", "Megatron
// torch_dist (PyTorch DCP, ...)", with "; rank-local metadata, N files"
// when so saved. The module name, read from the file, is escaped.
std::string DcpFormatName(const DcpInput& in);
// "safetensors (one file)" or "Hugging Face safetensors index (N shards)".
std::string SafetensorsFormatName(const SafetensorsInput& in);

// What ckpt-validate reports for a foreign input.
struct ForeignValidation {
  std::string path;
  std::string format;   // DcpFormatName, SafetensorsFormatName, ...
  std::string checked;  // what was checked, one line
  std::vector<std::string> errors, warnings;
};

// Every structural check of OpenDcp, the entry names (EntryNameProblems),
// then every record read, parsed, CRC-32 verified and checked against the
// metadata. Problems are collected, never returned.
ForeignValidation ValidateDcp(const std::string& path);
// Every check of OpenSafetensors, and the index's total_size against the
// tensors (a warning). safetensors stores no checksums: no value is read.
ForeignValidation ValidateSafetensors(const std::string& path);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_IO_FOREIGN_H_
