//! Each capability wired to the tools: a capability's logic lives in its own room
//! (`crate::egress`, `crate::packages`, `crate::approval`, `crate::audit`, `crate::output`,
//! `crate::metrics`, `crate::tasks`, `crate::pool`, `crate::pii`); the file of the same
//! name here is only what connects it to an execution or a request.

pub(crate) mod approvals;
pub(crate) mod audit;
pub(crate) mod egress;
pub mod metrics;
pub(crate) mod out_files;
pub(crate) mod outputs;
pub mod packages;
pub(crate) mod pii_vaults;
pub(crate) mod pool;
pub(crate) mod progress;
pub(crate) mod tasks;
