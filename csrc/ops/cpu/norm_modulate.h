// The CPU kernels of every norm-modulate op (cpu/norm_modulate.cpp), which each op's schema file
// registers for the CPU dispatch key through the host prologue (entry_points.h): validated
// problems in, outputs written. `config` (a CUDA tuning-table row) is unused on CPU.
#pragma once

#include <string>

#include "../problem.h"

namespace adaptiveload {

void norm_modulate_fwd_cpu(const ForwardProblem& p, const std::string* config);
void norm_modulate_bwd_cpu(const BackwardProblem& p, const std::string* config);

}  // namespace adaptiveload
