//! The benchmark's data, apart from the GPU: what is measured ([`shapes`]: model shapes, ops,
//! selections and their byte counts) and the JSON files ([`schema`]: results and plans).
//!
//! A crate of its own so that `ferrofuse-bench` (which links the GPU crates) and
//! `ferrofuse-report` (which draws charts on any machine) share one definition without either
//! pulling in the other's dependencies.

pub mod schema;
pub mod shapes;
