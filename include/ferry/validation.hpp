// ferry — the one switch of heavy validation.
//
// Every structure that can check itself (validate(), STYLE practice 3) runs it
// after every operation when heavy validation is on: in the dev preset
// (FERRY_HEAVY_VALIDATE=ON) by default, and wherever an options struct turns it
// on (PoolOptions::validate_each_op, ArenaOptions::validate_each_op).
#pragma once

#include "ferry/api.hpp"

namespace ferry FERRY_API {

// True when this build was configured with FERRY_HEAVY_VALIDATE. The default of
// every validate_each_op option.
bool heavy_validation_default() noexcept;

}  // namespace ferry
