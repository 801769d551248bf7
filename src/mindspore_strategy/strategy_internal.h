// Internal helpers shared by the strategy and transform sources.
#ifndef SAVEPOINT_MINDSPORE_STRATEGY_STRATEGY_INTERNAL_H_
#define SAVEPOINT_MINDSPORE_STRATEGY_STRATEGY_INTERNAL_H_

#include "savepoint/distributed.h"
#include "savepoint/mindspore_strategy.h"

namespace savepoint::internal {

// The layout of a strategy file as a MindSporeLayout (even splits required, optimizer sharding
// only when both its size and step are set, as MindSpore reads them).
MindSporeLayout ToMindSporeLayout(const MindSporeParamLayout& layout);

// The checks ShardFromLayout makes that do not depend on the rank (device matrix, tensor map,
// uneven split, optimizer pieces), in O(dims): InvalidArgument saying what is wrong (layout.cc).
Status CheckMindSporeLayout(const Shape& global_shape, const MindSporeLayout& layout);

}  // namespace savepoint::internal

#endif  // SAVEPOINT_MINDSPORE_STRATEGY_STRATEGY_INTERNAL_H_
