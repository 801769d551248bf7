// Test helper: MindSpore parameter layouts in one line.
#ifndef SAVEPOINT_MINDSPORE_STRATEGY_STRATEGY_TESTUTIL_H_
#define SAVEPOINT_MINDSPORE_STRATEGY_STRATEGY_TESTUTIL_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "savepoint/mindspore_strategy.h"

namespace savepoint::testing {

// A layout of device matrix `dev` and tensor map `map` (nested when a dim names several axes),
// optimizer-sharded `k` ways with rank stride `step`.
inline MindSporeParamLayout Layout(std::vector<int64_t> dev, std::vector<std::vector<int32_t>> map,
                                   int32_t k = 0, int32_t step = 0) {
  MindSporeParamLayout l;
  l.dev_matrix = std::move(dev);
  l.tensor_map = std::move(map);
  l.nested_tensor_map = std::any_of(l.tensor_map.begin(), l.tensor_map.end(),
                                    [](const auto& a) { return a.size() > 1; });
  l.opt_weight_shard_size = k;
  l.opt_weight_shard_step = step;
  return l;
}

}  // namespace savepoint::testing

#endif  // SAVEPOINT_MINDSPORE_STRATEGY_STRATEGY_TESTUTIL_H_
