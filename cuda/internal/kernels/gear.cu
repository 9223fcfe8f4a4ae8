// gear's kernels, compiled to one PTX module (gear.ptx) that package cuda embeds.
// Regenerate with `make ptx` after changing any file here; a test checks that
// gear.ptx and SHA256SUMS match these sources.

#include "gather.cuh"
#include "wsample.cuh"
#include "topk.cuh"
#include "mlp.cuh"
