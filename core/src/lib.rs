//! Shared by the shim (`libcuslice.so`) and the `cuslice` command.

pub mod config;
pub mod gpu;
pub mod pool;
pub mod segment;
pub mod shm;
pub mod sigbus;
#[cfg(test)]
mod testdir;
