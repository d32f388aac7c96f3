// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/statistics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpufleet::reliability {
namespace {

// P(X >= k) by brute force in long double: sum of the terms from k up to far past the mean.
double DirectUpperTail(int k, double mean) {
  long double sum = 0;
  for (int i = k; i < k + 2000 + static_cast<int>(mean * 3); ++i) {
    sum += std::exp(-static_cast<long double>(mean) + i * std::log(static_cast<long double>(mean)) -
                    std::lgamma(static_cast<long double>(i) + 1));
  }
  return static_cast<double>(sum);
}

TEST(PoissonUpperTail, MatchesHandComputedValues) {
  // 1 - e^-0.5 (1 + 0.5 + 0.125)
  EXPECT_NEAR(PoissonUpperTail(3, 0.5), 1 - std::exp(-0.5) * 1.625, 1e-15);
  EXPECT_NEAR(PoissonUpperTail(1, 2.0), 1 - std::exp(-2.0), 1e-15);
  // P(X <= 9) for a mean of 10 is 0.4579297.
  EXPECT_NEAR(PoissonUpperTail(10, 10.0), 1 - 0.4579297, 1e-7);
  EXPECT_EQ(PoissonUpperTail(0, 3.0), 1.0);
  EXPECT_EQ(PoissonUpperTail(-2, 3.0), 1.0);
  EXPECT_EQ(PoissonUpperTail(1, 0.0), 0.0);
  EXPECT_EQ(PoissonUpperTail(0, 0.0), 1.0);
  EXPECT_EQ(PoissonUpperTail(2, std::nan("")), 0.0);
}

TEST(PoissonUpperTail, StaysAccurateDeepInTheTailAndForLargeCounts) {
  for (const auto& [k, mean] :
       {std::pair{50, 1.0}, std::pair{20, 0.001}, std::pair{4, 8e-4}, std::pair{300, 250.0},
        std::pair{280, 300.0}, std::pair{400, 250.0}}) {
    SCOPED_TRACE(::testing::Message() << "k=" << k << " mean=" << mean);
    const double expected = DirectUpperTail(k, mean);
    EXPECT_NEAR(PoissonUpperTail(k, mean) / expected, 1.0, 1e-9);
  }
  EXPECT_GT(PoissonUpperTail(60, 0.001), 0.0);  // about 1e-262, not rounded to zero
  const double half = PoissonUpperTail(100000, 100000.0);
  EXPECT_GT(half, 0.49);
  EXPECT_LT(half, 0.51);
}

TEST(PoissonUpperTail, MatchesFiftyDigitReferenceValues) {
  // The regularized incomplete gamma function P(k, mean) from mpmath at 50 significant digits.
  struct Reference {
    int64_t k;
    double mean;
    double tail;
  };
  for (const Reference& r :
       {Reference{1, 1e-6, 9.9999950000016662137e-7}, Reference{2, 0.05, 0.001209104274250290586},
        Reference{5, 0.3, 0.00001578504054165996018}, Reference{7, 7.5, 0.62184530567653068486},
        Reference{12, 3.0, 0.000071386628974206604869},
        Reference{60, 0.001, 1.200598995791221471e-262},
        Reference{1000, 900.0, 0.00054990226571178292301},
        Reference{900, 1000.0, 0.99937740221572495274},
        Reference{100000, 100000.0, 0.50042052211036517669}}) {
    SCOPED_TRACE(::testing::Message() << "k=" << r.k << " mean=" << r.mean);
    EXPECT_NEAR(PoissonUpperTail(r.k, r.mean) / r.tail, 1.0, 1e-12);
  }
}

TEST(PoissonUpperTail, GrowsWithTheMeanAndFallsWithTheCount) {
  double previous = 0;
  for (double mean : {0.01, 0.1, 1.0, 5.0, 20.0}) {
    const double p = PoissonUpperTail(4, mean);
    EXPECT_GT(p, previous);
    previous = p;
  }
  previous = 1.0;
  for (int k = 1; k < 30; ++k) {
    const double p = PoissonUpperTail(k, 5.0);
    EXPECT_LT(p, previous);
    previous = p;
  }
}

TEST(BenjaminiHochberg, ReproducesThePaperExample) {
  // Benjamini and Hochberg (1995), section 4: 15 p-values; at a false-discovery rate of 0.05
  // the step-up procedure rejects the four smallest (Bonferroni only three).
  const std::vector<double> p = {0.0201, 0.0001, 0.4262, 0.0004, 0.0019, 0.0278, 0.0095, 0.0298,
                                 0.0344, 0.0459, 0.3240, 0.5719, 0.6528, 0.7590, 1.0000};
  const std::vector<double> q = BenjaminiHochberg(p);
  ASSERT_EQ(q.size(), p.size());
  EXPECT_NEAR(q[1], 0.0015, 1e-12);         // 0.0001 * 15 / 1
  EXPECT_NEAR(q[3], 0.003, 1e-12);          // 0.0004 * 15 / 2
  EXPECT_NEAR(q[4], 0.0095, 1e-12);         // 0.0019 * 15 / 3
  EXPECT_NEAR(q[6], 0.035625, 1e-12);       // 0.0095 * 15 / 4
  EXPECT_NEAR(q[0], 0.0603, 1e-12);         // 0.0201 * 15 / 5
  EXPECT_NEAR(q[5], 0.063857142857, 1e-9);  // step-up: 0.0298 * 15 / 7 < 0.0278 * 15 / 6
  EXPECT_NEAR(q[14], 1.0, 1e-12);
  EXPECT_EQ(std::count_if(q.begin(), q.end(), [](double v) { return v <= 0.05; }), 4);
}

TEST(BenjaminiHochberg, HandlesEdgeCases) {
  EXPECT_TRUE(BenjaminiHochberg({}).empty());
  EXPECT_THAT(BenjaminiHochberg({0.2}), ::testing::ElementsAre(0.2));
  const std::vector<double> q = BenjaminiHochberg({std::nan(""), -1.0, 2.0, 0.01});
  EXPECT_EQ(q[0], 1.0);
  EXPECT_EQ(q[1], 0.0);
  EXPECT_EQ(q[2], 1.0);
  EXPECT_NEAR(q[3], 0.02, 1e-12);  // rank 2 of 4
}

}  // namespace
}  // namespace gpufleet::reliability
