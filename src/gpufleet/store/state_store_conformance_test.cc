// SPDX-License-Identifier: Apache-2.0
// The conformance suite (state_store_conformance.cc) over the in-process backends; PostgreSQL's
// instantiation is in postgres_store_test.cc.
#include "gpufleet/store/state_store_conformance.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpufleet/store/memory_store.h"
#include "gpufleet/store/sqlite_store.h"
#include "gpufleet/store/state_store.h"
#include "gpufleet/store/testing/fault_injecting_store.h"

namespace gpufleet::store {
namespace {

// A fault injector with no fault pending must be indistinguishable from its inner store.
struct FaultInjectorOverMemory {
  InMemoryStateStore inner;
  testing::FaultInjectingStateStore outer{inner};
};

std::vector<StateStoreBackend> Backends() {
  return {
      {"memory",
       [](const std::string&) -> Result<std::shared_ptr<StateStore>> {
         return std::shared_ptr<StateStore>(std::make_shared<InMemoryStateStore>());
       }},
      {"sqlite",
       [](const std::string& dir) -> Result<std::shared_ptr<StateStore>> {
         GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<SqliteStateStore> store,
                                   SqliteStateStore::Open(dir + "/state.db"));
         return std::shared_ptr<StateStore>(std::move(store));
       }},
      {"fault_injector",
       [](const std::string&) -> Result<std::shared_ptr<StateStore>> {
         auto holder = std::make_shared<FaultInjectorOverMemory>();
         return std::shared_ptr<StateStore>(holder, &holder->outer);
       }},
  };
}

INSTANTIATE_TEST_SUITE_P(AllBackends, StateStoreConformanceTest, ::testing::ValuesIn(Backends()),
                         StateStoreBackendName);

}  // namespace
}  // namespace gpufleet::store
