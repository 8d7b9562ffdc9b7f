//! The GPUs as the host sees them: NVML ([`nvml`], loaded at run time)
//! and GPU health ([`health`], built on it).

pub mod health;
pub mod nvml;
