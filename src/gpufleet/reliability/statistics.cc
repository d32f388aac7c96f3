// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/statistics.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

namespace gpufleet::reliability {
namespace {

// log(k!): a sum for small k, Stirling's series beyond (error below 1e-15 there). std::lgamma
// would do, but it writes the global signgam, which is not thread-safe.
double LogFactorial(int64_t k) {
  constexpr int64_t kSumLimit = 256;
  if (k <= kSumLimit) {
    double sum = 0;
    for (int64_t i = 2; i <= k; ++i) {
      sum += std::log(static_cast<double>(i));
    }
    return sum;
  }
  const double x = static_cast<double>(k);
  const double inverse = 1.0 / x;
  const double inverse2 = inverse * inverse;
  return x * std::log(x) - x + 0.5 * std::log(2.0 * std::numbers::pi * x) +
         inverse * (1.0 / 12 - inverse2 * (1.0 / 360 - inverse2 / 1260));
}

// Stop adding terms once they no longer change the sum in double precision.
constexpr double kRelativeTolerance = 1e-17;

}  // namespace

double PoissonUpperTail(int64_t k, double mean) {
  if (k <= 0) {
    return 1.0;
  }
  if (!(mean > 0)) {  // also catches NaN
    return 0.0;
  }
  if (std::isinf(mean)) {
    return 1.0;
  }
  // Every term is built from its neighbour, starting at the term of k - 1 or k computed in
  // logs, so nothing underflows before it matters.
  const double kd = static_cast<double>(k);
  if (kd > mean) {
    // The tail itself: terms from k upward fall off at least geometrically once past the mean.
    double term = std::exp(-mean + kd * std::log(mean) - LogFactorial(k));
    double sum = 0;
    for (int64_t i = k; term > 0; ++i) {
      sum += term;
      term *= mean / static_cast<double>(i + 1);
      if (term < sum * kRelativeTolerance) {
        break;
      }
    }
    return std::min(1.0, sum);
  }
  // k <= mean: the tail is at least about one half, so 1 - P(X <= k - 1) loses nothing. Sum the
  // lower part downward from k - 1, where the terms are largest.
  double term = std::exp(-mean + (kd - 1) * std::log(mean) - LogFactorial(k - 1));
  double lower = 0;
  for (int64_t i = k - 1; i >= 0; --i) {
    lower += term;
    term *= static_cast<double>(i) / mean;
    if (term < lower * kRelativeTolerance) {
      break;
    }
  }
  return std::clamp(1.0 - lower, 0.0, 1.0);
}

std::vector<double> BenjaminiHochberg(const std::vector<double>& p_values) {
  const size_t m = p_values.size();
  std::vector<double> p(m);
  for (size_t i = 0; i < m; ++i) {
    p[i] = std::isnan(p_values[i]) ? 1.0 : std::clamp(p_values[i], 0.0, 1.0);
  }
  std::vector<size_t> order(m);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
  std::vector<double> q(m, 1.0);
  double running_min = 1.0;
  for (size_t rank = m; rank >= 1; --rank) {
    const size_t i = order[rank - 1];
    running_min = std::min(running_min, p[i] * static_cast<double>(m) / static_cast<double>(rank));
    q[i] = running_min;
  }
  return q;
}

}  // namespace gpufleet::reliability
