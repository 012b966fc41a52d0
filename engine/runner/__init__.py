"""Running the model for one step: the packed batch and the forward (model_runner), CUDA
graphs on a GPU (cuda_graphs), the whole decode step as one native call on a CPU
(native_decode), the forward's own clock (forward_timer) and the sampler. It takes the
scheduler's decisions (engine.core) and never makes one."""
