// savepoint-internal metadata in `inspect`'s human output: the Python package's structure tree
// (metadata key "savepoint.python", python/savepoint/_tree.py) and other large "savepoint.*" keys
// are hidden from the metadata line and summarized instead; `inspect --tree` prints the tree
// indented. --json output is not affected (it prints the metadata as stored).
#ifndef SAVEPOINT_TOOLS_PYTHON_TREE_H_
#define SAVEPOINT_TOOLS_PYTHON_TREE_H_

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "savepoint/value.h"

namespace savepoint::cli {

// Where the Python package records the structure of a saved object (_tree.py TREE_KEY).
inline constexpr char kPythonTreeKey[] = "savepoint.python";
// Prefix of the metadata keys savepoint itself writes ("savepoint.manager", ...).
inline constexpr char kInternalKeyPrefix[] = "savepoint.";
// An internal key whose value is longer than this (compact JSON) is hidden from human output.
inline constexpr size_t kMaxInlineInternalBytes = 200;

// Whether the member `key` of the metadata object is hidden from human output: kPythonTreeKey, and
// any other key starting with kInternalKeyPrefix whose compact JSON value is longer than
// kMaxInlineInternalBytes.
bool IsHiddenMetadataKey(std::string_view key, const Json& value);

// `meta` without its hidden members (`meta` itself when it is not an object).
Json VisibleMetadata(const Json& meta);

// One line per hidden member of `meta`, to print after the metadata line:
// "python structure: N leaves (--tree to show)" (or the tree itself when `tree`), and
// "internal metadata: savepoint.manager (12.3 KiB, --json to show)". With `tree` and no structure
// in `meta`, says so.
using LeafDescriber = std::function<std::string(const std::string& entry_name)>;
void PrintHiddenMetadata(const Json& meta, bool tree, const LeafDescriber& describe);

}  // namespace savepoint::cli

#endif  // SAVEPOINT_TOOLS_PYTHON_TREE_H_
