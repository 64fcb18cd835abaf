//! `[tasks]` in `codebox.toml`: executions as tasks of the MCP Tasks extension
//! (`io.modelcontextprotocol/tasks`, SEP-2663) for clients that declare it.
//!
//! ```toml
//! [tasks]
//! enabled = true          # default; false: every call is answered synchronously
//! keep_for = "15m"        # how long a task and its result stay readable
//! poll_interval = "1s"    # what tasks/get suggests to pollers
//! max_per_client = 32     # tasks one client may hold (running or kept) at once
//! ```

use std::time::Duration;

use serde::Deserialize;

use crate::units::parse_duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("tasks.{key}: {why}")]
    Invalid { key: &'static str, why: String },
}

/// The section as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TasksSection {
    /// Executions as tasks for clients that declare the extension (default true; false
    /// answers every call synchronously).
    pub enabled: Option<bool>,
    /// A task's lifetime, and how long its result stays readable after it ended (default
    /// 15m; at least `max_timeout` plus 5 minutes).
    pub keep_for: Option<String>,
    /// The polling interval `tasks/get` suggests (default 1s).
    pub poll_interval: Option<String>,
    /// Tasks one client holds, running or kept; the next is refused (default 32).
    pub max_per_client: Option<usize>,
}

/// What the section sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskSettings {
    pub enabled: bool,
    /// A task's lifetime from its creation (`ttlMs`). Also how long its result stays
    /// readable once it ended: the manager keeps a finished task one more `keep_for`.
    pub keep_for: Duration,
    pub poll_interval: Duration,
    pub max_per_client: usize,
}

impl Default for TaskSettings {
    fn default() -> Self {
        TaskSettings {
            enabled: true,
            keep_for: Duration::from_secs(15 * 60),
            poll_interval: Duration::from_secs(1),
            max_per_client: 32,
        }
    }
}

/// Time a task may wait for an admission slot and its packages on top of its own
/// timeout before its lifetime could end while it runs.
pub const START_ALLOWANCE: Duration = Duration::from_secs(5 * 60);

impl TasksSection {
    /// The settings; `max_timeout` is the longest an execution may run: a task's lifetime
    /// must cover it and the [`START_ALLOWANCE`], since the manager ends a task that is
    /// still running when its lifetime is over.
    pub fn settings(&self, max_timeout: Duration) -> Result<TaskSettings, Error> {
        let mut s = TaskSettings::default();
        if let Some(on) = self.enabled {
            s.enabled = on;
        }
        let duration = |key: &'static str, v: &str| {
            parse_duration(v).map_err(|why| Error::Invalid { key, why })
        };
        if let Some(v) = &self.poll_interval {
            let d = duration("poll_interval", v)?;
            if d < Duration::from_millis(100) || d > Duration::from_secs(60) {
                return Err(Error::Invalid {
                    key: "poll_interval",
                    why: format!("{v} is not between 100ms and 60s"),
                });
            }
            s.poll_interval = d;
        }
        let least = max_timeout + START_ALLOWANCE;
        match &self.keep_for {
            Some(v) => {
                let d = duration("keep_for", v)?;
                if d < least {
                    return Err(Error::Invalid {
                        key: "keep_for",
                        why: format!(
                            "{v} is shorter than max_timeout plus {} s for admission and packages ({} s): a task still running at the end of its lifetime would be cut off",
                            START_ALLOWANCE.as_secs(),
                            least.as_secs()
                        ),
                    });
                }
                if d > Duration::from_secs(7 * 24 * 3600) {
                    return Err(Error::Invalid {
                        key: "keep_for",
                        why: format!("{v} is more than 7 days"),
                    });
                }
                s.keep_for = d;
            }
            None => s.keep_for = s.keep_for.max(least),
        }
        if let Some(n) = self.max_per_client {
            if n == 0 || n > 10_000 {
                return Err(Error::Invalid {
                    key: "max_per_client",
                    why: format!("{n} is not between 1 and 10000"),
                });
            }
            s.max_per_client = n;
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIVE_MIN: Duration = Duration::from_secs(300);

    #[test]
    fn defaults_cover_the_longest_execution() {
        let s = TasksSection::default().settings(FIVE_MIN).unwrap();
        assert!(s.enabled);
        assert_eq!(s.keep_for, Duration::from_secs(15 * 60));
        let long = TasksSection::default()
            .settings(Duration::from_secs(3600))
            .unwrap();
        assert_eq!(long.keep_for, Duration::from_secs(3600) + START_ALLOWANCE);
    }

    #[test]
    fn a_lifetime_shorter_than_an_execution_is_refused() {
        let section = TasksSection {
            keep_for: Some("2m".into()),
            ..Default::default()
        };
        let e = section.settings(FIVE_MIN).unwrap_err().to_string();
        assert!(e.contains("tasks.keep_for") && e.contains("cut off"), "{e}");
    }

    #[test]
    fn bad_values_name_their_key() {
        for (section, key) in [
            (
                TasksSection {
                    poll_interval: Some("10ms".into()),
                    ..Default::default()
                },
                "tasks.poll_interval",
            ),
            (
                TasksSection {
                    max_per_client: Some(0),
                    ..Default::default()
                },
                "tasks.max_per_client",
            ),
            (
                TasksSection {
                    keep_for: Some("soon".into()),
                    ..Default::default()
                },
                "tasks.keep_for",
            ),
        ] {
            let e = section.settings(FIVE_MIN).unwrap_err().to_string();
            assert!(e.starts_with(key), "{e}");
        }
    }
}
