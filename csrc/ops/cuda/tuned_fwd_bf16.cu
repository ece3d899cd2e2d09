// The forward tuning table for bf16 x: one line per row, first match wins (dispatch.cu). Each
// row's kernel is instantiated here and nowhere else. See configs.h for the columns and
// docs/ops.md for how the rows were measured; benchmarks/tune_layer_norm_modulate.py prints
// candidate rows from a sweep.
#include "launch.cuh"

namespace adaptiveload {
namespace {

// clang-format off
constexpr FwdRow kRows[] = {
// id, arch, norm, op, modulation, vector path, D min, D max, rows min, rows max, kernel, {warps, stages, y_words, interleave}
{"fwd.bf16.loop", 0, Norm::kLayer, kEither, Mod::kAny, false, 1, kNoLimit, 1, kNoLimit, fwd_loop<c10::BFloat16, Norm::kLayer>("loop<bf16>"), {8, 2, false, true}},
{"fwd.bf16.plain.token16.block1", 0, Norm::kLayer, 0, Mod::kToken, true, 8, 2048, 1, kNoLimit, fwd_block<c10::BFloat16, 1, false, Norm::kLayer, 2>("block<bf16,1,plain,raw16>"), {8, 2, false, true}},
{"fwd.bf16.plain.token16.block2", 0, Norm::kLayer, 0, Mod::kToken, true, 2056, 4096, 1, kNoLimit, fwd_block<c10::BFloat16, 2, false, Norm::kLayer, 2>("block<bf16,2,plain,raw16>"), {8, 2, false, true}},
{"fwd.bf16.plain.token.block1", 0, Norm::kLayer, 0, Mod::kToken, true, 8, 2048, 1, kNoLimit, fwd_block<c10::BFloat16, 1, false, Norm::kLayer, 1>("block<bf16,1,plain,hoist>"), {8, 2, false, true}},
{"fwd.bf16.plain.token.block2", 0, Norm::kLayer, 0, Mod::kToken, true, 2056, 4096, 1, kNoLimit, fwd_block<c10::BFloat16, 2, false, Norm::kLayer, 1>("block<bf16,2,plain,hoist>"), {8, 2, false, true}},
{"fwd.bf16.plain.token.block4", 0, Norm::kLayer, 0, Mod::kToken, true, 4104, 8192, 1, kNoLimit, fwd_block<c10::BFloat16, 4, false, Norm::kLayer>("block<bf16,4,plain>"), {8, 2, false, true}},
{"fwd.bf16.plain.token.block8", 0, Norm::kLayer, 0, Mod::kToken, true, 8200, 32768, 1, kNoLimit, fwd_block<c10::BFloat16, 8, false, Norm::kLayer>("block<bf16,8,plain>"), {8, 2, false, true}},
{"fwd.bf16.plain.block.warp4x2x1", 0, Norm::kLayer, 0, Mod::kBlock, true, 8, 1024, 1, kNoLimit, fwd_warp<c10::BFloat16, 4, 2, 1, false, Norm::kLayer>("warp<bf16,4,2,1,plain>"), {8, 2, true, true}},
{"fwd.bf16.plain.block.ring6x2.full", 90, Norm::kLayer, 0, Mod::kBlock, true, 1536, 1536, 1, 37499, fwd_ring<c10::BFloat16, 6, 2, true, Norm::kLayer>("ring<bf16,6,2,full>"), {8, 2, false, true}},
{"fwd.bf16.plain.block.ring6x2", 90, Norm::kLayer, 0, Mod::kBlock, true, 1032, 1528, 1, 37499, fwd_ring<c10::BFloat16, 6, 2, false, Norm::kLayer>("ring<bf16,6,2>"), {8, 2, false, true}},
{"fwd.bf16.plain.block.warp6x2x1", 0, Norm::kLayer, 0, Mod::kBlock, true, 1032, 1536, 1, kNoLimit, fwd_warp<c10::BFloat16, 6, 2, 1, false, Norm::kLayer>("warp<bf16,6,2,1,plain>"), {8, 2, true, true}},
{"fwd.bf16.plain.block.warp12x1x1", 0, Norm::kLayer, 0, Mod::kBlock, true, 1544, 3072, 1, kNoLimit, fwd_warp<c10::BFloat16, 12, 1, 1, false, Norm::kLayer>("warp<bf16,12,1,1,plain>"), {8, 2, true, true}},
{"fwd.bf16.plain.block.warp10x1x2", 0, Norm::kLayer, 0, Mod::kBlock, true, 3080, 5120, 1, kNoLimit, fwd_warp<c10::BFloat16, 10, 1, 2, false, Norm::kLayer>("warp<bf16,10,1,2,plain>"), {8, 2, true, true}},
{"fwd.bf16.plain.block.warp12x1x2", 0, Norm::kLayer, 0, Mod::kBlock, true, 5128, 6144, 1, kNoLimit, fwd_warp<c10::BFloat16, 12, 1, 2, false, Norm::kLayer>("warp<bf16,12,1,2,plain>"), {8, 2, true, true}},
{"fwd.bf16.plain.block.warp10x1x4", 0, Norm::kLayer, 0, Mod::kBlock, true, 6152, 10240, 1, kNoLimit, fwd_warp<c10::BFloat16, 10, 1, 4, false, Norm::kLayer>("warp<bf16,10,1,4,plain>"), {8, 2, true, true}},
{"fwd.bf16.plain.block.block8", 0, Norm::kLayer, 0, Mod::kBlock, true, 10248, 32768, 1, kNoLimit, fwd_block<c10::BFloat16, 8, false, Norm::kLayer>("block<bf16,8,plain>"), {8, 2, false, true}},
{"fwd.bf16.gated.token16.block1", 0, Norm::kLayer, 1, Mod::kToken, true, 8, 2048, 1, kNoLimit, fwd_block<c10::BFloat16, 1, true, Norm::kLayer, 2>("block<bf16,1,gated,raw16>"), {8, 2, false, true}},
{"fwd.bf16.gated.token16.block2", 0, Norm::kLayer, 1, Mod::kToken, true, 2056, 4096, 1, kNoLimit, fwd_block<c10::BFloat16, 2, true, Norm::kLayer, 2>("block<bf16,2,gated,raw16>"), {8, 2, false, true}},
{"fwd.bf16.gated.token.block1", 0, Norm::kLayer, 1, Mod::kToken, true, 8, 2048, 1, kNoLimit, fwd_block<c10::BFloat16, 1, true, Norm::kLayer, 1>("block<bf16,1,gated,hoist>"), {8, 2, false, true}},
{"fwd.bf16.gated.token.block2", 0, Norm::kLayer, 1, Mod::kToken, true, 2056, 4096, 1, kNoLimit, fwd_block<c10::BFloat16, 2, true, Norm::kLayer, 1>("block<bf16,2,gated,hoist>"), {8, 2, false, true}},
{"fwd.bf16.gated.token.block4", 0, Norm::kLayer, 1, Mod::kToken, true, 4104, 8192, 1, kNoLimit, fwd_block<c10::BFloat16, 4, true, Norm::kLayer>("block<bf16,4,gated>"), {8, 2, false, true}},
{"fwd.bf16.gated.token.block8", 0, Norm::kLayer, 1, Mod::kToken, true, 8200, 32768, 1, kNoLimit, fwd_block<c10::BFloat16, 8, true, Norm::kLayer>("block<bf16,8,gated>"), {8, 2, false, true}},
{"fwd.bf16.gated.block.warp4x2x1", 0, Norm::kLayer, 1, Mod::kBlock, true, 8, 1024, 1, kNoLimit, fwd_warp<c10::BFloat16, 4, 2, 1, true, Norm::kLayer>("warp<bf16,4,2,1,gated>"), {8, 2, true, true}},
{"fwd.bf16.gated.block.warp6x2x1", 0, Norm::kLayer, 1, Mod::kBlock, true, 1032, 1536, 1, kNoLimit, fwd_warp<c10::BFloat16, 6, 2, 1, true, Norm::kLayer>("warp<bf16,6,2,1,gated>"), {8, 2, true, true}},
{"fwd.bf16.gated.block.warp12x1x1", 0, Norm::kLayer, 1, Mod::kBlock, true, 1544, 3072, 1, kNoLimit, fwd_warp<c10::BFloat16, 12, 1, 1, true, Norm::kLayer>("warp<bf16,12,1,1,gated>"), {8, 2, true, true}},
{"fwd.bf16.gated.block.warp10x1x2", 0, Norm::kLayer, 1, Mod::kBlock, true, 3080, 5120, 1, kNoLimit, fwd_warp<c10::BFloat16, 10, 1, 2, true, Norm::kLayer>("warp<bf16,10,1,2,gated>"), {8, 2, true, true}},
{"fwd.bf16.gated.block.warp12x1x2", 0, Norm::kLayer, 1, Mod::kBlock, true, 5128, 6144, 1, kNoLimit, fwd_warp<c10::BFloat16, 12, 1, 2, true, Norm::kLayer>("warp<bf16,12,1,2,gated>"), {8, 2, true, true}},
{"fwd.bf16.gated.block.warp10x1x4", 0, Norm::kLayer, 1, Mod::kBlock, true, 6152, 10240, 1, kNoLimit, fwd_warp<c10::BFloat16, 10, 1, 4, true, Norm::kLayer>("warp<bf16,10,1,4,gated>"), {8, 2, true, true}},
{"fwd.bf16.gated.block.block8", 0, Norm::kLayer, 1, Mod::kBlock, true, 10248, 32768, 1, kNoLimit, fwd_block<c10::BFloat16, 8, true, Norm::kLayer>("block<bf16,8,gated>"), {8, 2, false, true}},
// RMSNorm (Norm::kRms): the LayerNorm rows' settings, not tuned separately (docs/ops.md)
{"fwd.bf16.rms.loop", 0, Norm::kRms, kEither, Mod::kAny, false, 1, kNoLimit, 1, kNoLimit, fwd_loop<c10::BFloat16, Norm::kRms>("loop<bf16,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.plain.token16.block1", 0, Norm::kRms, 0, Mod::kToken, true, 8, 2048, 1, kNoLimit, fwd_block<c10::BFloat16, 1, false, Norm::kRms, 2>("block<bf16,1,plain,raw16,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.plain.token16.block2", 0, Norm::kRms, 0, Mod::kToken, true, 2056, 4096, 1, kNoLimit, fwd_block<c10::BFloat16, 2, false, Norm::kRms, 2>("block<bf16,2,plain,raw16,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.plain.token.block1", 0, Norm::kRms, 0, Mod::kToken, true, 8, 2048, 1, kNoLimit, fwd_block<c10::BFloat16, 1, false, Norm::kRms, 1>("block<bf16,1,plain,hoist,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.plain.token.block2", 0, Norm::kRms, 0, Mod::kToken, true, 2056, 4096, 1, kNoLimit, fwd_block<c10::BFloat16, 2, false, Norm::kRms, 1>("block<bf16,2,plain,hoist,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.plain.token.block4", 0, Norm::kRms, 0, Mod::kToken, true, 4104, 8192, 1, kNoLimit, fwd_block<c10::BFloat16, 4, false, Norm::kRms>("block<bf16,4,plain,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.plain.token.block8", 0, Norm::kRms, 0, Mod::kToken, true, 8200, 32768, 1, kNoLimit, fwd_block<c10::BFloat16, 8, false, Norm::kRms>("block<bf16,8,plain,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.plain.block.warp4x2x1", 0, Norm::kRms, 0, Mod::kBlock, true, 8, 1024, 1, kNoLimit, fwd_warp<c10::BFloat16, 4, 2, 1, false, Norm::kRms>("warp<bf16,4,2,1,plain,rms>"), {8, 2, true, true}},
{"fwd.bf16.rms.plain.block.ring6x2.full", 90, Norm::kRms, 0, Mod::kBlock, true, 1536, 1536, 1, 37499, fwd_ring<c10::BFloat16, 6, 2, true, Norm::kRms>("ring<bf16,6,2,full,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.plain.block.ring6x2", 90, Norm::kRms, 0, Mod::kBlock, true, 1032, 1528, 1, 37499, fwd_ring<c10::BFloat16, 6, 2, false, Norm::kRms>("ring<bf16,6,2,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.plain.block.warp6x2x1", 0, Norm::kRms, 0, Mod::kBlock, true, 1032, 1536, 1, kNoLimit, fwd_warp<c10::BFloat16, 6, 2, 1, false, Norm::kRms>("warp<bf16,6,2,1,plain,rms>"), {8, 2, true, true}},
{"fwd.bf16.rms.plain.block.warp12x1x1", 0, Norm::kRms, 0, Mod::kBlock, true, 1544, 3072, 1, kNoLimit, fwd_warp<c10::BFloat16, 12, 1, 1, false, Norm::kRms>("warp<bf16,12,1,1,plain,rms>"), {8, 2, true, true}},
{"fwd.bf16.rms.plain.block.warp10x1x2", 0, Norm::kRms, 0, Mod::kBlock, true, 3080, 5120, 1, kNoLimit, fwd_warp<c10::BFloat16, 10, 1, 2, false, Norm::kRms>("warp<bf16,10,1,2,plain,rms>"), {8, 2, true, true}},
{"fwd.bf16.rms.plain.block.warp12x1x2", 0, Norm::kRms, 0, Mod::kBlock, true, 5128, 6144, 1, kNoLimit, fwd_warp<c10::BFloat16, 12, 1, 2, false, Norm::kRms>("warp<bf16,12,1,2,plain,rms>"), {8, 2, true, true}},
{"fwd.bf16.rms.plain.block.warp10x1x4", 0, Norm::kRms, 0, Mod::kBlock, true, 6152, 10240, 1, kNoLimit, fwd_warp<c10::BFloat16, 10, 1, 4, false, Norm::kRms>("warp<bf16,10,1,4,plain,rms>"), {8, 2, true, true}},
{"fwd.bf16.rms.plain.block.block8", 0, Norm::kRms, 0, Mod::kBlock, true, 10248, 32768, 1, kNoLimit, fwd_block<c10::BFloat16, 8, false, Norm::kRms>("block<bf16,8,plain,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.gated.token16.block1", 0, Norm::kRms, 1, Mod::kToken, true, 8, 2048, 1, kNoLimit, fwd_block<c10::BFloat16, 1, true, Norm::kRms, 2>("block<bf16,1,gated,raw16,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.gated.token16.block2", 0, Norm::kRms, 1, Mod::kToken, true, 2056, 4096, 1, kNoLimit, fwd_block<c10::BFloat16, 2, true, Norm::kRms, 2>("block<bf16,2,gated,raw16,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.gated.token.block1", 0, Norm::kRms, 1, Mod::kToken, true, 8, 2048, 1, kNoLimit, fwd_block<c10::BFloat16, 1, true, Norm::kRms, 1>("block<bf16,1,gated,hoist,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.gated.token.block2", 0, Norm::kRms, 1, Mod::kToken, true, 2056, 4096, 1, kNoLimit, fwd_block<c10::BFloat16, 2, true, Norm::kRms, 1>("block<bf16,2,gated,hoist,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.gated.token.block4", 0, Norm::kRms, 1, Mod::kToken, true, 4104, 8192, 1, kNoLimit, fwd_block<c10::BFloat16, 4, true, Norm::kRms>("block<bf16,4,gated,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.gated.token.block8", 0, Norm::kRms, 1, Mod::kToken, true, 8200, 32768, 1, kNoLimit, fwd_block<c10::BFloat16, 8, true, Norm::kRms>("block<bf16,8,gated,rms>"), {8, 2, false, true}},
{"fwd.bf16.rms.gated.block.warp4x2x1", 0, Norm::kRms, 1, Mod::kBlock, true, 8, 1024, 1, kNoLimit, fwd_warp<c10::BFloat16, 4, 2, 1, true, Norm::kRms>("warp<bf16,4,2,1,gated,rms>"), {8, 2, true, true}},
{"fwd.bf16.rms.gated.block.warp6x2x1", 0, Norm::kRms, 1, Mod::kBlock, true, 1032, 1536, 1, kNoLimit, fwd_warp<c10::BFloat16, 6, 2, 1, true, Norm::kRms>("warp<bf16,6,2,1,gated,rms>"), {8, 2, true, true}},
{"fwd.bf16.rms.gated.block.warp12x1x1", 0, Norm::kRms, 1, Mod::kBlock, true, 1544, 3072, 1, kNoLimit, fwd_warp<c10::BFloat16, 12, 1, 1, true, Norm::kRms>("warp<bf16,12,1,1,gated,rms>"), {8, 2, true, true}},
{"fwd.bf16.rms.gated.block.warp10x1x2", 0, Norm::kRms, 1, Mod::kBlock, true, 3080, 5120, 1, kNoLimit, fwd_warp<c10::BFloat16, 10, 1, 2, true, Norm::kRms>("warp<bf16,10,1,2,gated,rms>"), {8, 2, true, true}},
{"fwd.bf16.rms.gated.block.warp12x1x2", 0, Norm::kRms, 1, Mod::kBlock, true, 5128, 6144, 1, kNoLimit, fwd_warp<c10::BFloat16, 12, 1, 2, true, Norm::kRms>("warp<bf16,12,1,2,gated,rms>"), {8, 2, true, true}},
{"fwd.bf16.rms.gated.block.warp10x1x4", 0, Norm::kRms, 1, Mod::kBlock, true, 6152, 10240, 1, kNoLimit, fwd_warp<c10::BFloat16, 10, 1, 4, true, Norm::kRms>("warp<bf16,10,1,4,gated,rms>"), {8, 2, true, true}},
{"fwd.bf16.rms.gated.block.block8", 0, Norm::kRms, 1, Mod::kBlock, true, 10248, 32768, 1, kNoLimit, fwd_block<c10::BFloat16, 8, true, Norm::kRms>("block<bf16,8,gated,rms>"), {8, 2, false, true}},
};
// clang-format on
static_assert(norms_agree(kRows), "a row's norm must be its kernel's");

}  // namespace

const Table<FwdRow> kFwdTableBF16 = {kRows, sizeof(kRows) / sizeof(kRows[0])};

}  // namespace adaptiveload
