//! codebox's own tools, prompts and resources, one file per family: the execute tools
//! (`execute`), sessions, skills, search/get/list of upstream tools (`reachable`,
//! `model_facing`), the `tools` setting, the JSON schemas, how a result is rendered, and
//! the methods sandboxed code calls on codebox itself (`sandbox_methods`).

pub(crate) mod execute;
pub(crate) mod extra_resources;
pub(crate) mod microvm_runs;
pub(crate) mod model_facing;
pub(crate) mod prompts;
pub(crate) mod reachable;
pub mod render;
pub(crate) mod resource_methods;
pub mod resources;
pub(crate) mod sandbox_methods;
pub mod schema;
pub(crate) mod session_runs;
pub(crate) mod sessions;
pub(crate) mod skill_check;
pub(crate) mod skills;
pub mod tool_set;
