// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/statistics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <boost/math/policies/policy.hpp>
#include <boost/math/special_functions/gamma.hpp>

namespace gpufleet::reliability {
namespace {

// Errors come back as values (NaN, infinity), never as exceptions: the inputs are checked first.
// Doubles are not promoted to long double: the tail stays within about 1e-14 of the exact value
// and a call costs about a tenth of the promoted one's time.
using TailPolicy = boost::math::policies::policy<
    boost::math::policies::domain_error<boost::math::policies::ignore_error>,
    boost::math::policies::pole_error<boost::math::policies::ignore_error>,
    boost::math::policies::overflow_error<boost::math::policies::ignore_error>,
    boost::math::policies::evaluation_error<boost::math::policies::ignore_error>,
    boost::math::policies::promote_double<false>>;

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
  // P(X >= k) for X ~ Poisson(mean) is the regularized lower incomplete gamma function P(k, mean),
  // which Boost.Math evaluates without forming 1 - CDF, so it stays accurate deep in the tail.
  return std::clamp(boost::math::gamma_p(static_cast<double>(k), mean, TailPolicy()), 0.0, 1.0);
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
