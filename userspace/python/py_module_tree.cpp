// SPDX-License-Identifier: Apache-2.0
// LivePyResolver::Process's module paths: the tree of torch modules below a
// root, walked through their _modules dicts within a byte bound, evicted
// least recently used first.
#include "py_process.hpp"

namespace commdbg::python {

using namespace pyobj;

// Module trees take at most half the process's share: the code objects and
// frames of the same records need the rest.  Past it the least recently asked
// tree goes (but the one being walked); a tree alone larger is cut there.
bool LivePyResolver::Process::tree_charge(Tree& tree, uint64_t root, size_t n) {
    for (;;) {
        if (tree_bytes_ + n <= account_.per_process / 2 && charge(n)) {
            tree_bytes_ += n, tree.bytes += n;
            return true;
        }
        if (!evict_tree(root)) return false;
    }
}

void LivePyResolver::Process::drop_tree(Tree& tree) {
    std::unordered_map<uint64_t, Tree::Node>().swap(tree.nodes);
    std::vector<std::string>().swap(tree.names);
    release(tree.bytes);
    tree_bytes_ -= tree.bytes, tree.bytes = 0;
}

bool LivePyResolver::Process::evict_tree(uint64_t keep) {
    Tree* lru = nullptr;
    for (auto& [root, t] : trees_)
        if (root != keep && t.bytes != 0 && (lru == nullptr || t.used < lru->used)) lru = &t;
    if (lru == nullptr) return false;
    drop_tree(*lru);
    ++account_.stats->evicted_trees;
    return true;
}

LivePyResolver::Process::Tree* LivePyResolver::Process::tree_of(uint64_t root) {
    if (auto it = trees_.find(root); it != trees_.end()) return &it->second;
    if (!charge(kEntryOverhead + sizeof(std::pair<uint64_t, Tree>))) return nullptr;
    return &trees_[root];
}

// The children of module `m` (its _modules dict) join the tree; false when
// the tree is full or out of room.
bool LivePyResolver::Process::walk_children(uint64_t m, size_t depth, uint64_t root, Tree& tree,
                                            std::deque<std::pair<uint64_t, size_t>>& queue,
                                            std::unordered_map<uint64_t, uint32_t>& name_ids) {
    constexpr size_t kNodeBytes = kEntryOverhead + sizeof(std::pair<uint64_t, Tree::Node>);
    uint64_t modules = depth < kMaxModuleDepth ? attr(m, "_modules") : 0;
    bool room = true;
    if (modules == 0) return true;
    dict_items(modules, [&](uint64_t key, uint64_t child) {
        if (child == d_.layout.none_addr || tree.nodes.count(child) != 0) return true;
        auto id = name_ids.find(key);
        if (id == name_ids.end()) {
            auto name = str(key);
            if (!name) return true;
            if (!(room = tree_charge(tree, root, sizeof(std::string) + heap_of(*name) + kEntryOverhead))) return false;
            tree.names.push_back(std::move(*name));
            id = name_ids.emplace(key, static_cast<uint32_t>(tree.names.size() - 1)).first;
        }
        if (!(room = tree_charge(tree, root, kNodeBytes))) return false;
        tree.nodes.emplace(child, Tree::Node{m, id->second});
        queue.emplace_back(child, depth + 1);
        return tree.nodes.size() < kMaxModules;
    });
    return room && tree.nodes.size() < kMaxModules;
}

void LivePyResolver::Process::build_tree(uint64_t root, Tree& tree) {
    WalkMemo memo;
    memo_ = &memo;
    drop_tree(tree);
    // Key objects to names: a key shared by many modules ("0", "weight") is one name.
    std::unordered_map<uint64_t, uint32_t> name_ids;
    bool whole = tree_charge(tree, root, kEntryOverhead + sizeof(std::pair<uint64_t, Tree::Node>));
    if (whole) tree.nodes.emplace(root, Tree::Node{});
    std::deque<std::pair<uint64_t, size_t>> queue{{root, 0}};
    while (whole && !queue.empty()) {
        auto [m, depth] = queue.front();
        queue.pop_front();
        whole = walk_children(m, depth, root, tree, queue, name_ids);
    }
    // The name index was charged as part of the names (kEntryOverhead each) and is kept as such.
    memo_ = nullptr;
    if (!whole && tree.nodes.size() < kMaxModules) ++account_.stats->cut_walks;
}

// The dotted path from the tree's root, cut on the left past kPyMaxModulePath.
std::optional<std::string> LivePyResolver::Process::path_in(const Tree& tree, uint64_t module) const {
    std::vector<const std::string*> names;  // innermost first
    size_t len = 0;
    bool cut = false;
    for (uint64_t m = module, steps = 0;; ++steps) {
        auto it = tree.nodes.find(m);
        if (it == tree.nodes.end() || steps > kMaxModuleDepth) return std::nullopt;
        if (it->second.parent == 0) break;
        const std::string& name = tree.names[it->second.name];
        if (len + name.size() + 1 > kPyMaxModulePath) cut = true;
        if (!cut) names.push_back(&name), len += name.size() + 1;
        m = it->second.parent;
    }
    std::string path = cut ? "\u2026" : "";
    for (size_t i = names.size(); i-- > 0;) path += (path.empty() ? "" : ".") + *names[i];
    return path;
}

// The tree below `root` is walked once; a module not in it may have been
// added since, so a miss walks it again, but at most once a second and
// kMaxTreeBuilds times (a model that makes modules in forward() misses
// often, and a large tree takes a while), then the answer is kept.  An
// evicted tree misses everything: walked again under the same rule.
std::optional<std::string> LivePyResolver::Process::module_path(uint64_t root, uint64_t module) {
    if (root == module) return std::string();
    if (!d_.ok() || !layout_error_.empty()) return std::nullopt;
    const auto key = std::make_pair(root, module);
    if (auto it = paths_.find(key); it != paths_.end()) return it->second;
    Tree* tree = tree_of(root);
    if (tree == nullptr) {
        ++account_.stats->cut_walks;
        return std::nullopt;
    }
    tree->used = ++tree_clock_;
    const auto now = std::chrono::steady_clock::now();
    if (tree->builds == 0 || (tree->nodes.count(module) == 0 && tree->builds < kMaxTreeBuilds &&
                              now - tree->built >= std::chrono::seconds(1))) {
        build_tree(root, *tree);
        tree->built = now, ++tree->builds;
    }
    std::optional<std::string> path = path_in(*tree, module);
    if (charge(kEntryOverhead + sizeof(std::pair<decltype(key), std::optional<std::string>>) + heap_of(path)))
        paths_.emplace(key, path);
    return path;
}

}  // namespace commdbg::python
