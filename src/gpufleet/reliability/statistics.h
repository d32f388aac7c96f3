// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <vector>

// The two statistical tools of failure attribution: an exact one-sided Poisson test and the
// Benjamini-Hochberg step-up procedure. Pure functions.
namespace gpufleet::reliability {

// P(X >= k) for X ~ Poisson(mean): the exact upper tail, the one-sided p-value of observing k or
// more events when `mean` are expected. Accurate in relative terms far into the tail (1e-300),
// where 1 - CDF would round to zero. k <= 0 gives 1; a mean <= 0 (or not a number) gives 1 for
// k <= 0 and 0 otherwise.
double PoissonUpperTail(int64_t k, double mean);

// Benjamini-Hochberg adjusted p-values ("q-values"), in the order of `p_values`: q_i is the
// smallest false-discovery rate at which hypothesis i would be rejected by the step-up procedure,
// min over j with p_(j) >= p_i of p_(j) * m / rank(j), capped at 1. Rejecting every hypothesis
// with q <= alpha controls the false-discovery rate at alpha for independent or positively
// dependent tests. p-values outside [0, 1] (or not a number) are clamped (NaN as 1).
std::vector<double> BenjaminiHochberg(const std::vector<double>& p_values);

}  // namespace gpufleet::reliability
