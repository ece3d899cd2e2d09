// The forward tuning table for f32 x: one line per row, first match wins (dispatch.cu). Each
// row's kernel is instantiated here and nowhere else. See configs.h for the columns and
// docs/ops.md for how the rows were measured; benchmarks/tune_layer_norm_modulate.py prints
// candidate rows from a sweep.
#include "launch.cuh"

namespace adaptiveload {
namespace {

// clang-format off
constexpr FwdRow kRows[] = {
// id, arch, norm, op, modulation, vector path, D min, D max, rows min, rows max, kernel, {warps, stages, y_words, interleave}
{"fwd.f32.loop", 0, Norm::kLayer, kEither, Mod::kAny, false, 1, kNoLimit, 1, kNoLimit, fwd_loop<float, Norm::kLayer>("loop<f32>"), {8, 2, false, true}},
{"fwd.f32.plain.token.block1", 0, Norm::kLayer, 0, Mod::kToken, true, 4, 1024, 1, kNoLimit, fwd_block<float, 1, false, Norm::kLayer, 1>("block<f32,1,plain,hoist>"), {8, 2, false, true}},
{"fwd.f32.plain.token.block2", 0, Norm::kLayer, 0, Mod::kToken, true, 1028, 2048, 1, kNoLimit, fwd_block<float, 2, false, Norm::kLayer, 1>("block<f32,2,plain,hoist>"), {8, 2, false, true}},
{"fwd.f32.plain.token.block4", 0, Norm::kLayer, 0, Mod::kToken, true, 2052, 4096, 1, kNoLimit, fwd_block<float, 4, false, Norm::kLayer>("block<f32,4,plain>"), {8, 2, false, true}},
{"fwd.f32.plain.token.block8", 0, Norm::kLayer, 0, Mod::kToken, true, 4100, 16384, 1, kNoLimit, fwd_block<float, 8, false, Norm::kLayer>("block<f32,8,plain>"), {8, 2, false, true}},
{"fwd.f32.plain.block.warp4x2x1", 0, Norm::kLayer, 0, Mod::kBlock, true, 4, 512, 1, kNoLimit, fwd_warp<float, 4, 2, 1, false, Norm::kLayer>("warp<f32,4,2,1,plain>"), {8, 2, true, true}},
{"fwd.f32.plain.block.warp6x2x1", 0, Norm::kLayer, 0, Mod::kBlock, true, 516, 768, 1, kNoLimit, fwd_warp<float, 6, 2, 1, false, Norm::kLayer>("warp<f32,6,2,1,plain>"), {8, 2, true, true}},
{"fwd.f32.plain.block.warp12x1x1", 0, Norm::kLayer, 0, Mod::kBlock, true, 772, 1536, 1, kNoLimit, fwd_warp<float, 12, 1, 1, false, Norm::kLayer>("warp<f32,12,1,1,plain>"), {8, 2, true, true}},
{"fwd.f32.plain.block.warp10x1x2", 0, Norm::kLayer, 0, Mod::kBlock, true, 1540, 2560, 1, kNoLimit, fwd_warp<float, 10, 1, 2, false, Norm::kLayer>("warp<f32,10,1,2,plain>"), {8, 2, true, true}},
{"fwd.f32.plain.block.warp12x1x2", 0, Norm::kLayer, 0, Mod::kBlock, true, 2564, 3072, 1, kNoLimit, fwd_warp<float, 12, 1, 2, false, Norm::kLayer>("warp<f32,12,1,2,plain>"), {8, 2, true, true}},
{"fwd.f32.plain.block.warp10x1x4", 0, Norm::kLayer, 0, Mod::kBlock, true, 3076, 5120, 1, kNoLimit, fwd_warp<float, 10, 1, 4, false, Norm::kLayer>("warp<f32,10,1,4,plain>"), {8, 2, true, true}},
{"fwd.f32.plain.block.block8", 0, Norm::kLayer, 0, Mod::kBlock, true, 5124, 16384, 1, kNoLimit, fwd_block<float, 8, false, Norm::kLayer>("block<f32,8,plain>"), {8, 2, false, true}},
{"fwd.f32.gated.token.block1", 0, Norm::kLayer, 1, Mod::kToken, true, 4, 1024, 1, kNoLimit, fwd_block<float, 1, true, Norm::kLayer, 1>("block<f32,1,gated,hoist>"), {8, 2, false, true}},
{"fwd.f32.gated.token.block2", 0, Norm::kLayer, 1, Mod::kToken, true, 1028, 2048, 1, kNoLimit, fwd_block<float, 2, true, Norm::kLayer, 1>("block<f32,2,gated,hoist>"), {8, 2, false, true}},
{"fwd.f32.gated.token.block4", 0, Norm::kLayer, 1, Mod::kToken, true, 2052, 4096, 1, kNoLimit, fwd_block<float, 4, true, Norm::kLayer>("block<f32,4,gated>"), {8, 2, false, true}},
{"fwd.f32.gated.token.block8", 0, Norm::kLayer, 1, Mod::kToken, true, 4100, 16384, 1, kNoLimit, fwd_block<float, 8, true, Norm::kLayer>("block<f32,8,gated>"), {8, 2, false, true}},
{"fwd.f32.gated.block.warp4x2x1", 0, Norm::kLayer, 1, Mod::kBlock, true, 4, 512, 1, kNoLimit, fwd_warp<float, 4, 2, 1, true, Norm::kLayer>("warp<f32,4,2,1,gated>"), {8, 2, true, true}},
{"fwd.f32.gated.block.warp6x2x1", 0, Norm::kLayer, 1, Mod::kBlock, true, 516, 768, 1, kNoLimit, fwd_warp<float, 6, 2, 1, true, Norm::kLayer>("warp<f32,6,2,1,gated>"), {8, 2, true, true}},
{"fwd.f32.gated.block.warp12x1x1", 0, Norm::kLayer, 1, Mod::kBlock, true, 772, 1536, 1, kNoLimit, fwd_warp<float, 12, 1, 1, true, Norm::kLayer>("warp<f32,12,1,1,gated>"), {8, 2, true, true}},
{"fwd.f32.gated.block.warp10x1x2", 0, Norm::kLayer, 1, Mod::kBlock, true, 1540, 2560, 1, kNoLimit, fwd_warp<float, 10, 1, 2, true, Norm::kLayer>("warp<f32,10,1,2,gated>"), {8, 2, true, true}},
{"fwd.f32.gated.block.warp12x1x2", 0, Norm::kLayer, 1, Mod::kBlock, true, 2564, 3072, 1, kNoLimit, fwd_warp<float, 12, 1, 2, true, Norm::kLayer>("warp<f32,12,1,2,gated>"), {8, 2, true, true}},
{"fwd.f32.gated.block.warp10x1x4", 0, Norm::kLayer, 1, Mod::kBlock, true, 3076, 5120, 1, kNoLimit, fwd_warp<float, 10, 1, 4, true, Norm::kLayer>("warp<f32,10,1,4,gated>"), {8, 2, true, true}},
{"fwd.f32.gated.block.block8", 0, Norm::kLayer, 1, Mod::kBlock, true, 5124, 16384, 1, kNoLimit, fwd_block<float, 8, true, Norm::kLayer>("block<f32,8,gated>"), {8, 2, false, true}},
// RMSNorm (Norm::kRms): the LayerNorm rows' settings, not tuned separately (docs/ops.md)
{"fwd.f32.rms.loop", 0, Norm::kRms, kEither, Mod::kAny, false, 1, kNoLimit, 1, kNoLimit, fwd_loop<float, Norm::kRms>("loop<f32,rms>"), {8, 2, false, true}},
{"fwd.f32.rms.plain.token.block1", 0, Norm::kRms, 0, Mod::kToken, true, 4, 1024, 1, kNoLimit, fwd_block<float, 1, false, Norm::kRms, 1>("block<f32,1,plain,hoist,rms>"), {8, 2, false, true}},
{"fwd.f32.rms.plain.token.block2", 0, Norm::kRms, 0, Mod::kToken, true, 1028, 2048, 1, kNoLimit, fwd_block<float, 2, false, Norm::kRms, 1>("block<f32,2,plain,hoist,rms>"), {8, 2, false, true}},
{"fwd.f32.rms.plain.token.block4", 0, Norm::kRms, 0, Mod::kToken, true, 2052, 4096, 1, kNoLimit, fwd_block<float, 4, false, Norm::kRms>("block<f32,4,plain,rms>"), {8, 2, false, true}},
{"fwd.f32.rms.plain.token.block8", 0, Norm::kRms, 0, Mod::kToken, true, 4100, 16384, 1, kNoLimit, fwd_block<float, 8, false, Norm::kRms>("block<f32,8,plain,rms>"), {8, 2, false, true}},
{"fwd.f32.rms.plain.block.warp4x2x1", 0, Norm::kRms, 0, Mod::kBlock, true, 4, 512, 1, kNoLimit, fwd_warp<float, 4, 2, 1, false, Norm::kRms>("warp<f32,4,2,1,plain,rms>"), {8, 2, true, true}},
{"fwd.f32.rms.plain.block.warp6x2x1", 0, Norm::kRms, 0, Mod::kBlock, true, 516, 768, 1, kNoLimit, fwd_warp<float, 6, 2, 1, false, Norm::kRms>("warp<f32,6,2,1,plain,rms>"), {8, 2, true, true}},
{"fwd.f32.rms.plain.block.warp12x1x1", 0, Norm::kRms, 0, Mod::kBlock, true, 772, 1536, 1, kNoLimit, fwd_warp<float, 12, 1, 1, false, Norm::kRms>("warp<f32,12,1,1,plain,rms>"), {8, 2, true, true}},
{"fwd.f32.rms.plain.block.warp10x1x2", 0, Norm::kRms, 0, Mod::kBlock, true, 1540, 2560, 1, kNoLimit, fwd_warp<float, 10, 1, 2, false, Norm::kRms>("warp<f32,10,1,2,plain,rms>"), {8, 2, true, true}},
{"fwd.f32.rms.plain.block.warp12x1x2", 0, Norm::kRms, 0, Mod::kBlock, true, 2564, 3072, 1, kNoLimit, fwd_warp<float, 12, 1, 2, false, Norm::kRms>("warp<f32,12,1,2,plain,rms>"), {8, 2, true, true}},
{"fwd.f32.rms.plain.block.warp10x1x4", 0, Norm::kRms, 0, Mod::kBlock, true, 3076, 5120, 1, kNoLimit, fwd_warp<float, 10, 1, 4, false, Norm::kRms>("warp<f32,10,1,4,plain,rms>"), {8, 2, true, true}},
{"fwd.f32.rms.plain.block.block8", 0, Norm::kRms, 0, Mod::kBlock, true, 5124, 16384, 1, kNoLimit, fwd_block<float, 8, false, Norm::kRms>("block<f32,8,plain,rms>"), {8, 2, false, true}},
{"fwd.f32.rms.gated.token.block1", 0, Norm::kRms, 1, Mod::kToken, true, 4, 1024, 1, kNoLimit, fwd_block<float, 1, true, Norm::kRms, 1>("block<f32,1,gated,hoist,rms>"), {8, 2, false, true}},
{"fwd.f32.rms.gated.token.block2", 0, Norm::kRms, 1, Mod::kToken, true, 1028, 2048, 1, kNoLimit, fwd_block<float, 2, true, Norm::kRms, 1>("block<f32,2,gated,hoist,rms>"), {8, 2, false, true}},
{"fwd.f32.rms.gated.token.block4", 0, Norm::kRms, 1, Mod::kToken, true, 2052, 4096, 1, kNoLimit, fwd_block<float, 4, true, Norm::kRms>("block<f32,4,gated,rms>"), {8, 2, false, true}},
{"fwd.f32.rms.gated.token.block8", 0, Norm::kRms, 1, Mod::kToken, true, 4100, 16384, 1, kNoLimit, fwd_block<float, 8, true, Norm::kRms>("block<f32,8,gated,rms>"), {8, 2, false, true}},
{"fwd.f32.rms.gated.block.warp4x2x1", 0, Norm::kRms, 1, Mod::kBlock, true, 4, 512, 1, kNoLimit, fwd_warp<float, 4, 2, 1, true, Norm::kRms>("warp<f32,4,2,1,gated,rms>"), {8, 2, true, true}},
{"fwd.f32.rms.gated.block.warp6x2x1", 0, Norm::kRms, 1, Mod::kBlock, true, 516, 768, 1, kNoLimit, fwd_warp<float, 6, 2, 1, true, Norm::kRms>("warp<f32,6,2,1,gated,rms>"), {8, 2, true, true}},
{"fwd.f32.rms.gated.block.warp12x1x1", 0, Norm::kRms, 1, Mod::kBlock, true, 772, 1536, 1, kNoLimit, fwd_warp<float, 12, 1, 1, true, Norm::kRms>("warp<f32,12,1,1,gated,rms>"), {8, 2, true, true}},
{"fwd.f32.rms.gated.block.warp10x1x2", 0, Norm::kRms, 1, Mod::kBlock, true, 1540, 2560, 1, kNoLimit, fwd_warp<float, 10, 1, 2, true, Norm::kRms>("warp<f32,10,1,2,gated,rms>"), {8, 2, true, true}},
{"fwd.f32.rms.gated.block.warp12x1x2", 0, Norm::kRms, 1, Mod::kBlock, true, 2564, 3072, 1, kNoLimit, fwd_warp<float, 12, 1, 2, true, Norm::kRms>("warp<f32,12,1,2,gated,rms>"), {8, 2, true, true}},
{"fwd.f32.rms.gated.block.warp10x1x4", 0, Norm::kRms, 1, Mod::kBlock, true, 3076, 5120, 1, kNoLimit, fwd_warp<float, 10, 1, 4, true, Norm::kRms>("warp<f32,10,1,4,gated,rms>"), {8, 2, true, true}},
{"fwd.f32.rms.gated.block.block8", 0, Norm::kRms, 1, Mod::kBlock, true, 5124, 16384, 1, kNoLimit, fwd_block<float, 8, true, Norm::kRms>("block<f32,8,gated,rms>"), {8, 2, false, true}},
};
// clang-format on
static_assert(norms_agree(kRows), "a row's norm must be its kernel's");

}  // namespace

const Table<FwdRow> kFwdTableF32 = {kRows, sizeof(kRows) / sizeof(kRows[0])};

}  // namespace adaptiveload
