// The forward tuning table for f16 x: first match wins (dispatch.cu). Each line is a
// LayerNorm row and its RMSNorm twin (configs.h: shared rows); no row is tuned for one norm
// alone today. Each row's kernel is instantiated here and nowhere else. See configs.h for the
// columns and docs/ops.md for how the rows were measured; benchmarks/tune_layer_norm_modulate.py
// prints candidate rows from a sweep.
#include "launch.cuh"

namespace adaptiveload {
namespace {

// clang-format off
// id (after TABLE_ID), arch, (op, modulation, vector path, D min, D max, rows min, rows max), kernel, (arguments before the norm), (after it), name, {warps, stages, y_words, interleave}
#define TABLE_ID "fwd.f16."
#define SHARED_ROWS(ROW) \
ROW("loop", 0, (kEither, Mod::kAny, false, 1, kNoLimit, 1, kNoLimit), fwd_loop, (c10::Half), (), "loop<f16", {8, 2, false, true}) \
ROW("plain.token16.block1", 0, (0, Mod::kToken, true, 8, 2048, 1, kNoLimit), fwd_block, (c10::Half, 1, false), (, 2), "block<f16,1,plain,raw16", {8, 2, false, true}) \
ROW("plain.token16.block2", 0, (0, Mod::kToken, true, 2056, 4096, 1, kNoLimit), fwd_block, (c10::Half, 2, false), (, 2), "block<f16,2,plain,raw16", {8, 2, false, true}) \
ROW("plain.token.block1", 0, (0, Mod::kToken, true, 8, 2048, 1, kNoLimit), fwd_block, (c10::Half, 1, false), (, 1), "block<f16,1,plain,hoist", {8, 2, false, true}) \
ROW("plain.token.block2", 0, (0, Mod::kToken, true, 2056, 4096, 1, kNoLimit), fwd_block, (c10::Half, 2, false), (, 1), "block<f16,2,plain,hoist", {8, 2, false, true}) \
ROW("plain.token.block4", 0, (0, Mod::kToken, true, 4104, 8192, 1, kNoLimit), fwd_block, (c10::Half, 4, false), (), "block<f16,4,plain", {8, 2, false, true}) \
ROW("plain.token.block8", 0, (0, Mod::kToken, true, 8200, 32768, 1, kNoLimit), fwd_block, (c10::Half, 8, false), (), "block<f16,8,plain", {8, 2, false, true}) \
ROW("plain.block.warp4x2x1", 0, (0, Mod::kBlock, true, 8, 1024, 1, kNoLimit), fwd_warp, (c10::Half, 4, 2, 1, false), (), "warp<f16,4,2,1,plain", {8, 2, true, true}) \
ROW("plain.block.warp6x2x1", 0, (0, Mod::kBlock, true, 1032, 1536, 1, kNoLimit), fwd_warp, (c10::Half, 6, 2, 1, false), (), "warp<f16,6,2,1,plain", {8, 2, true, true}) \
ROW("plain.block.warp12x1x1", 0, (0, Mod::kBlock, true, 1544, 3072, 1, kNoLimit), fwd_warp, (c10::Half, 12, 1, 1, false), (), "warp<f16,12,1,1,plain", {8, 2, true, true}) \
ROW("plain.block.warp10x1x2", 0, (0, Mod::kBlock, true, 3080, 5120, 1, kNoLimit), fwd_warp, (c10::Half, 10, 1, 2, false), (), "warp<f16,10,1,2,plain", {8, 2, true, true}) \
ROW("plain.block.warp12x1x2", 0, (0, Mod::kBlock, true, 5128, 6144, 1, kNoLimit), fwd_warp, (c10::Half, 12, 1, 2, false), (), "warp<f16,12,1,2,plain", {8, 2, true, true}) \
ROW("plain.block.warp10x1x4", 0, (0, Mod::kBlock, true, 6152, 10240, 1, kNoLimit), fwd_warp, (c10::Half, 10, 1, 4, false), (), "warp<f16,10,1,4,plain", {8, 2, true, true}) \
ROW("plain.block.block8", 0, (0, Mod::kBlock, true, 10248, 32768, 1, kNoLimit), fwd_block, (c10::Half, 8, false), (), "block<f16,8,plain", {8, 2, false, true}) \
ROW("gated.token16.block1", 0, (1, Mod::kToken, true, 8, 2048, 1, kNoLimit), fwd_block, (c10::Half, 1, true), (, 2), "block<f16,1,gated,raw16", {8, 2, false, true}) \
ROW("gated.token16.block2", 0, (1, Mod::kToken, true, 2056, 4096, 1, kNoLimit), fwd_block, (c10::Half, 2, true), (, 2), "block<f16,2,gated,raw16", {8, 2, false, true}) \
ROW("gated.token.block1", 0, (1, Mod::kToken, true, 8, 2048, 1, kNoLimit), fwd_block, (c10::Half, 1, true), (, 1), "block<f16,1,gated,hoist", {8, 2, false, true}) \
ROW("gated.token.block2", 0, (1, Mod::kToken, true, 2056, 4096, 1, kNoLimit), fwd_block, (c10::Half, 2, true), (, 1), "block<f16,2,gated,hoist", {8, 2, false, true}) \
ROW("gated.token.block4", 0, (1, Mod::kToken, true, 4104, 8192, 1, kNoLimit), fwd_block, (c10::Half, 4, true), (), "block<f16,4,gated", {8, 2, false, true}) \
ROW("gated.token.block8", 0, (1, Mod::kToken, true, 8200, 32768, 1, kNoLimit), fwd_block, (c10::Half, 8, true), (), "block<f16,8,gated", {8, 2, false, true}) \
ROW("gated.block.warp4x2x1", 0, (1, Mod::kBlock, true, 8, 1024, 1, kNoLimit), fwd_warp, (c10::Half, 4, 2, 1, true), (), "warp<f16,4,2,1,gated", {8, 2, true, true}) \
ROW("gated.block.warp6x2x1", 0, (1, Mod::kBlock, true, 1032, 1536, 1, kNoLimit), fwd_warp, (c10::Half, 6, 2, 1, true), (), "warp<f16,6,2,1,gated", {8, 2, true, true}) \
ROW("gated.block.warp12x1x1", 0, (1, Mod::kBlock, true, 1544, 3072, 1, kNoLimit), fwd_warp, (c10::Half, 12, 1, 1, true), (), "warp<f16,12,1,1,gated", {8, 2, true, true}) \
ROW("gated.block.warp10x1x2", 0, (1, Mod::kBlock, true, 3080, 5120, 1, kNoLimit), fwd_warp, (c10::Half, 10, 1, 2, true), (), "warp<f16,10,1,2,gated", {8, 2, true, true}) \
ROW("gated.block.warp12x1x2", 0, (1, Mod::kBlock, true, 5128, 6144, 1, kNoLimit), fwd_warp, (c10::Half, 12, 1, 2, true), (), "warp<f16,12,1,2,gated", {8, 2, true, true}) \
ROW("gated.block.warp10x1x4", 0, (1, Mod::kBlock, true, 6152, 10240, 1, kNoLimit), fwd_warp, (c10::Half, 10, 1, 4, true), (), "warp<f16,10,1,4,gated", {8, 2, true, true}) \
ROW("gated.block.block8", 0, (1, Mod::kBlock, true, 10248, 32768, 1, kNoLimit), fwd_block, (c10::Half, 8, true), (), "block<f16,8,gated", {8, 2, false, true})
constexpr FwdRow kRows[] = {SHARED_ROWS(LAYER_NORM_ROW) SHARED_ROWS(RMS_NORM_ROW)};
#undef SHARED_ROWS
#undef TABLE_ID
// clang-format on
static_assert(norms_agree(kRows), "a row's norm must be its kernel's");

}  // namespace

const Table<FwdRow> kFwdTableF16 = {kRows, sizeof(kRows) / sizeof(kRows[0])};

}  // namespace adaptiveload
