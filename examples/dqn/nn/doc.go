// Package nn is a small multilayer perceptron for value-based reinforcement
// learning, written with plain float32 slices: fully connected layers with ReLU
// between them, the Huber loss, global-norm gradient clipping, and Adam.
//
// All parameters of a network live in one []float32 and all gradients in
// another, in the same layout, so that a data-parallel trainer can all-reduce
// the gradient vector in one call and a parameter service can publish the
// parameters as one vector. Layer i's weights (Out×In, row-major, one row per
// output unit) come before its biases, and layer i comes before layer i+1.
//
// A caller does, in order:
//
//  1. m := nn.NewMLP([]int{4, 128, 128, 2}, maxBatch, rng);
//  2. per step: m.ZeroGrad(); out := m.Forward(x, n); compute dLoss/dout;
//     m.Backward(dout, n) (gradients accumulate into m.Grads());
//  3. optionally all-reduce m.Grads(), ClipGradNorm, then opt.Step(m.Params(), m.Grads()).
//
// Forward and Backward allocate nothing: activations and deltas are
// preallocated for maxBatch rows. The slice Forward returns is owned by the
// network and is overwritten by the next Forward. Forward keeps a reference to
// its input x, which must not change until Backward returns. An MLP is not safe
// for concurrent use.
package nn
