#include "batch/candidates.h"

#include <algorithm>
#include <cmath>

namespace estream::batch {

std::vector<double> CandidateProbabilities(std::span<const double> log_likelihoods) {
  std::vector<double> p(log_likelihoods.begin(), log_likelihoods.end());
  if (p.empty()) return p;
  const double mx = *std::max_element(p.begin(), p.end());
  double sum = 0;
  for (double& x : p) sum += (x = std::exp(x - mx));
  for (double& x : p) x /= sum;
  return p;
}

std::vector<double> CandidateProbabilities(std::span<const ContinuationScore> candidates) {
  std::vector<double> ll;
  ll.reserve(candidates.size());
  for (const ContinuationScore& c : candidates) ll.push_back(c.log_likelihood);
  return CandidateProbabilities(ll);
}

size_t BestCandidate(std::span<const ContinuationScore> candidates) {
  size_t best = 0;
  for (size_t i = 1; i < candidates.size(); ++i)
    if (candidates[i].log_likelihood > candidates[best].log_likelihood) best = i;
  return best;
}

}  // namespace estream::batch
