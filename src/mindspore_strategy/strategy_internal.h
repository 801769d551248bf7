// Internal helpers shared by the strategy and transform sources.
#ifndef SAVEPOINT_MINDSPORE_STRATEGY_STRATEGY_INTERNAL_H_
#define SAVEPOINT_MINDSPORE_STRATEGY_STRATEGY_INTERNAL_H_

#include "savepoint/distributed.h"
#include "savepoint/mindspore_strategy.h"

namespace savepoint::internal {

// The layout of a strategy file as the distributed layer's MindSporeLayout (even splits required,
// optimizer sharding only when both its size and step are set, as MindSpore reads them).
MindSporeLayout ToMindSporeLayout(const MindSporeParamLayout& layout);

}  // namespace savepoint::internal

#endif  // SAVEPOINT_MINDSPORE_STRATEGY_STRATEGY_INTERNAL_H_
