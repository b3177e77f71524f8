// Candidate continuations of one prompt, compared: the label probabilities of classification
// (the server's /v1/classify, the Python module's Model.classify) from the log-likelihoods the
// engine returns for a request's continuations (Response::continuations).
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "estream/engine.h"

namespace estream::batch {

// softmax over candidates' log-likelihoods (natural log), computed in double with the max
// subtracted: p_i = exp(ll_i - max) / sum_j exp(ll_j - max), summing to 1. Empty for none.
std::vector<double> CandidateProbabilities(std::span<const double> log_likelihoods);
// The same over the continuations' log_likelihood.
std::vector<double> CandidateProbabilities(std::span<const ContinuationScore> candidates);

// The index of the most likely candidate (the first on ties); 0 for none.
size_t BestCandidate(std::span<const ContinuationScore> candidates);

}  // namespace estream::batch
