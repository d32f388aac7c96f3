// SPDX-License-Identifier: Apache-2.0
// The StateStore conformance suite (state_store_conformance.cc), for every backend: a test binary
// instantiates it with its backends, e.g.
//
//   INSTANTIATE_TEST_SUITE_P(AllBackends, StateStoreConformanceTest,
//                            ::testing::ValuesIn(MyBackends()), StateStoreBackendName);
//
// state_store_conformance_test.cc does so for the in-process backends, postgres_store_test.cc for
// PostgreSQL.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/state_store.h"

namespace gpufleet::store {

// Builds an empty store whose files (if any) live in `dir`.
using StoreFactory = std::function<Result<std::shared_ptr<StateStore>>(const std::string& dir)>;

struct StateStoreBackend {
  std::string name;
  StoreFactory make;
};

// Names the instantiated tests after the backend ("/sqlite").
inline std::string StateStoreBackendName(
    const ::testing::TestParamInfo<StateStoreBackend>& param_info) {
  return param_info.param.name;
}

class StateStoreConformanceTest : public ::testing::TestWithParam<StateStoreBackend> {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/gpufleet_store_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = pattern;
    Result<std::shared_ptr<StateStore>> store = GetParam().make(dir_);
    ASSERT_OK(store);
    store_ = std::move(store).value();
  }

  void TearDown() override {
    store_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  StateStore& store() { return *store_; }

  // Commits a batch of one create, failing the test on error.
  void CreateOrFail(const std::string& kind, const std::string& name, const std::string& data) {
    ASSERT_OK(store().Commit(WriteBatch().Create(kind, name, data)));
  }

  int64_t RevisionOrZero() {
    Result<int64_t> revision = store().Revision();
    EXPECT_OK(revision);
    return revision.ok() ? *revision : 0;
  }

  std::vector<std::string> ListNames(const std::string& kind, const std::string& prefix = "") {
    Result<std::vector<StoredObject>> objects = store().List(kind, prefix);
    EXPECT_OK(objects);
    std::vector<std::string> names;
    if (objects.ok()) {
      for (const StoredObject& object : *objects) {
        names.push_back(object.name);
      }
    }
    return names;
  }

 private:
  std::string dir_;
  std::shared_ptr<StateStore> store_;
};

}  // namespace gpufleet::store
