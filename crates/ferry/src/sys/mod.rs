//! Thin wrappers over the few system calls ferry needs.

pub mod fdpass;
pub mod huge_pages;
pub mod shm;
