// Hidden internal metadata and the Python structure tree in `inspect`'s human output
// (python_tree.h). The tree comes from a file on disk: every shape is checked, and anything
// unexpected is printed as "?" rather than trusted.
#include "python_tree.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace savepoint::cli {
namespace {

// Deeper structures are cut off with "..." (the recursion stays shallow on hostile input).
constexpr int kMaxDepth = 64;
// Longest text of an unrecognized node that is printed.
constexpr size_t kMaxUnknownChars = 60;

constexpr const char* kContainerKinds[] = {"dict", "odict", "list", "tuple"};
constexpr const char* kLeafKinds[] = {"torch",  "numpy", "npscalar", "value",
                                      "bigint", "none",  "sparse"};

// The kind of a tree node ("dict", "torch", ...; _tree.py ENCODING), or "" when not recognized.
std::string NodeKind(const Json& node) {
  if (!node.is_object()) return "";
  for (const char* k : kContainerKinds) {
    if (node.contains(k)) return k;
  }
  for (const char* k : kLeafKinds) {
    if (node.contains(k)) return k;
  }
  return "";
}

bool IsContainer(const std::string& kind) {
  return kind == "dict" || kind == "odict" || kind == "list" || kind == "tuple";
}

// `s` as is when it has no control characters, else quoted with JSON escapes.
std::string SafeText(const std::string& s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) return CompactJson(Json(s));
  }
  return s;
}

std::string Shorten(const std::string& s) { return Abbreviate(s, kMaxUnknownChars); }

// A mapping key: a string key quoted, an int key ({"int": N}) as N.
std::string KeyLabel(const Json& key) {
  if (key.is_object() && key.size() == 1 && key.contains("int")) return CompactJson(key.at("int"));
  return Shorten(CompactJson(key));
}

// Calls f(label, child) for each child of container `node` of kind `kind`.
template <class F>
void ForEachChild(const Json& node, const std::string& kind, F f) {
  const Json& items = node.at(kind);
  if (!items.is_array()) return;
  const bool mapping = kind == "dict" || kind == "odict";
  size_t i = 0;
  for (const Json& item : items) {
    if (!mapping) {
      f(fmt::format("[{}]", i), item);
    } else if (item.is_array() && item.size() == 2) {
      f(KeyLabel(item[0]), item[1]);
    } else {
      f("?", item);
    }
    ++i;
  }
}

uint64_t CountLeaves(const Json& node, int depth) {
  const std::string kind = NodeKind(node);
  if (kind.empty()) return 0;
  if (!IsContainer(kind)) return 1;
  uint64_t n = 0;
  if (depth < kMaxDepth) {
    ForEachChild(node, kind,
                 [&](const std::string&, const Json& c) { n += CountLeaves(c, depth + 1); });
  }
  return n;
}

// "torch model.w  BF16 [2, 3] (param, requires_grad, device cuda:0)", "value step  int 7", "none".
std::string LeafText(const Json& node, const std::string& kind, const LeafDescriber& describe) {
  if (kind == "none") return "none";
  const Json& name = node.at(kind);
  if (!name.is_string()) return kind + " ?";
  std::string text = kind + " " + SafeText(name.get<std::string>());
  std::string about = describe ? describe(name.get<std::string>()) : "";
  if (!about.empty()) text += "  " + about;
  std::vector<std::string> flags;
  auto flag = [&](const char* key) {  // never node.value(): it throws on a non-boolean
    auto it = node.find(key);
    return it != node.end() && it->is_boolean() && it->get<bool>();
  };
  if (flag("param")) flags.push_back("param");
  if (flag("grad")) flags.push_back("requires_grad");
  if (auto d = node.find("device"); d != node.end() && d->is_string()) {
    flags.push_back("device " + SafeText(d->get<std::string>()));
  }
  if (!flags.empty()) text += fmt::format(" ({})", fmt::join(flags, ", "));
  return text;
}

void PrintNode(const Json& node, const std::string& label, int depth,
               const LeafDescriber& describe) {
  const std::string indent(2 * depth, ' ');
  const std::string prefix = label.empty() ? "" : label + ": ";
  const std::string kind = NodeKind(node);
  if (kind.empty()) {
    fmt::print("{}{}? {}\n", indent, prefix, Shorten(CompactJson(node)));
  } else if (!IsContainer(kind)) {
    fmt::print("{}{}{}\n", indent, prefix, LeafText(node, kind, describe));
  } else if (depth >= kMaxDepth) {
    fmt::print("{}{}{} ...\n", indent, prefix, kind);
  } else {
    fmt::print("{}{}{}\n", indent, prefix, kind);
    ForEachChild(node, kind, [&](const std::string& l, const Json& c) {
      PrintNode(c, l, depth + 1, describe);
    });
  }
}

// The structure's root node, or null when `tree` is not {"root": NODE, ...} with a known NODE.
const Json* TreeRoot(const Json& tree) {
  if (!tree.is_object()) return nullptr;
  auto root = tree.find("root");
  if (root == tree.end() || NodeKind(*root).empty()) return nullptr;
  return &*root;
}

void PrintPythonTree(const Json& tree, bool show, const LeafDescriber& describe) {
  const Json* root = TreeRoot(tree);
  if (root == nullptr) {
    fmt::print("python structure: not recognized ({}, --json to show)\n",
               HumanBytes(CompactJson(tree).size()));
    return;
  }
  const uint64_t leaves = CountLeaves(*root, 0);
  if (!show) {
    fmt::print("python structure: {} leaves (--tree to show)\n", leaves);
    return;
  }
  fmt::print("python structure: {} leaves\n", leaves);
  PrintNode(*root, "", 1, describe);
}

}  // namespace

bool IsHiddenMetadataKey(std::string_view key, const Json& value) {
  if (key == kPythonTreeKey) return true;
  return key.starts_with(kInternalKeyPrefix) && CompactJson(value).size() > kMaxInlineInternalBytes;
}

Json VisibleMetadata(const Json& meta) {
  if (!meta.is_object()) return meta;
  Json out = Json::object();
  for (const auto& [k, v] : meta.items()) {
    if (!IsHiddenMetadataKey(k, v)) out[k] = v;
  }
  return out;
}

void PrintHiddenMetadata(const Json& meta, bool tree, const LeafDescriber& describe) {
  const bool object = meta.is_object();
  if (object) {
    for (const auto& [k, v] : meta.items()) {
      if (k == kPythonTreeKey || !IsHiddenMetadataKey(k, v)) continue;
      fmt::print("internal metadata: {} ({}, --json to show)\n", SafeText(k),
                 HumanBytes(CompactJson(v).size()));
    }
  }
  auto it = object ? meta.find(kPythonTreeKey) : meta.end();
  if (!object || it == meta.end()) {
    if (tree) fmt::print("python structure: none (no \"{}\" metadata)\n", kPythonTreeKey);
    return;
  }
  PrintPythonTree(*it, tree, describe);
}

}  // namespace savepoint::cli
