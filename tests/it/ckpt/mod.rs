//! Checkpoints, preemption, resume and the training hold, end to end under `mpirun`:
//! of iALS (`als`) and of the embedding model (`embed`), and its incremental checkpoints (`delta`).

mod als;
mod delta;
mod embed;
