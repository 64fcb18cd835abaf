//! Made-up catalogs of any size, for benchmarks and tests: tools such as
//! `crm__search_contacts` spread over about one server per 20 tools, with descriptions of
//! one to three sentences and input schemas of one to eight properties (strings, numbers,
//! booleans, enums, arrays, nested objects), some with an output schema.
//!
//! Deterministic for a seed (xorshift64*), with no dependency.

use serde_json::{json, Map, Value};

use crate::upstream::catalog::{Catalog, CatalogTool};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // splitmix64 of the seed: nearby seeds give unrelated streams, and never zero (a
        // zero state would stay zero).
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// A kind of server: its name, what it is, and the things it manages (singular, plural).
struct Domain {
    server: &'static str,
    system: &'static str,
    entities: &'static [(&'static str, &'static str)],
}

const DOMAINS: &[Domain] = &[
    Domain {
        server: "crm",
        system: "the CRM",
        entities: &[
            ("contact", "contacts"),
            ("deal", "deals"),
            ("company", "companies"),
            ("lead", "leads"),
            ("note", "notes"),
        ],
    },
    Domain {
        server: "github",
        system: "GitHub",
        entities: &[
            ("issue", "issues"),
            ("pull_request", "pull_requests"),
            ("repository", "repositories"),
            ("branch", "branches"),
            ("release", "releases"),
        ],
    },
    Domain {
        server: "jira",
        system: "Jira",
        entities: &[
            ("ticket", "tickets"),
            ("sprint", "sprints"),
            ("board", "boards"),
            ("epic", "epics"),
            ("comment", "comments"),
        ],
    },
    Domain {
        server: "slack",
        system: "Slack",
        entities: &[
            ("message", "messages"),
            ("channel", "channels"),
            ("user", "users"),
            ("reaction", "reactions"),
            ("reminder", "reminders"),
        ],
    },
    Domain {
        server: "calendar",
        system: "the calendar",
        entities: &[
            ("event", "events"),
            ("calendar", "calendars"),
            ("attendee", "attendees"),
            ("room", "rooms"),
            ("availability_slot", "availability_slots"),
        ],
    },
    Domain {
        server: "drive",
        system: "cloud storage",
        entities: &[
            ("file", "files"),
            ("folder", "folders"),
            ("permission", "permissions"),
            ("revision", "revisions"),
            ("shared_link", "shared_links"),
        ],
    },
    Domain {
        server: "billing",
        system: "the billing system",
        entities: &[
            ("invoice", "invoices"),
            ("subscription", "subscriptions"),
            ("payment", "payments"),
            ("customer", "customers"),
            ("refund", "refunds"),
        ],
    },
    Domain {
        server: "analytics",
        system: "the analytics warehouse",
        entities: &[
            ("report", "reports"),
            ("dashboard", "dashboards"),
            ("metric", "metrics"),
            ("segment", "segments"),
            ("funnel", "funnels"),
        ],
    },
    Domain {
        server: "postgres",
        system: "the database",
        entities: &[
            ("table", "tables"),
            ("row", "rows"),
            ("query", "queries"),
            ("index", "indexes"),
            ("schema", "schemas"),
        ],
    },
    Domain {
        server: "mail",
        system: "the mailbox",
        entities: &[
            ("email", "emails"),
            ("draft", "drafts"),
            ("thread", "threads"),
            ("label", "labels"),
            ("attachment", "attachments"),
        ],
    },
    Domain {
        server: "weather",
        system: "the weather service",
        entities: &[
            ("forecast", "forecasts"),
            ("alert", "alerts"),
            ("station", "stations"),
            ("observation", "observations"),
            ("radar_image", "radar_images"),
        ],
    },
    Domain {
        server: "maps",
        system: "the maps service",
        entities: &[
            ("place", "places"),
            ("route", "routes"),
            ("geocode", "geocodes"),
            ("review", "reviews"),
            ("traffic_report", "traffic_reports"),
        ],
    },
    Domain {
        server: "kubernetes",
        system: "the cluster",
        entities: &[
            ("pod", "pods"),
            ("deployment", "deployments"),
            ("service", "services"),
            ("namespace", "namespaces"),
            ("config_map", "config_maps"),
        ],
    },
    Domain {
        server: "monitoring",
        system: "the monitoring platform",
        entities: &[
            ("incident", "incidents"),
            ("monitor", "monitors"),
            ("alert_rule", "alert_rules"),
            ("log_entry", "log_entries"),
            ("trace", "traces"),
        ],
    },
    Domain {
        server: "shop",
        system: "the online shop",
        entities: &[
            ("product", "products"),
            ("order", "orders"),
            ("cart", "carts"),
            ("coupon", "coupons"),
            ("shipment", "shipments"),
        ],
    },
    Domain {
        server: "hr",
        system: "the HR system",
        entities: &[
            ("employee", "employees"),
            ("department", "departments"),
            ("time_off_request", "time_off_requests"),
            ("payslip", "payslips"),
            ("job_opening", "job_openings"),
        ],
    },
    Domain {
        server: "support",
        system: "the help desk",
        entities: &[
            ("conversation", "conversations"),
            ("macro", "macros"),
            ("agent", "agents"),
            ("satisfaction_rating", "satisfaction_ratings"),
            ("article", "articles"),
        ],
    },
    Domain {
        server: "notion",
        system: "the wiki",
        entities: &[
            ("page", "pages"),
            ("database", "databases"),
            ("block", "blocks"),
            ("workspace", "workspaces"),
            ("template", "templates"),
        ],
    },
];

/// Second and later servers of one domain: `crm_eu`, `crm_staging`, ...
const VARIANTS: &[&str] = &[
    "eu", "us", "staging", "internal", "legacy", "sandbox", "apac", "backup",
];

/// Verbs: name, whether it takes the plural, the first sentence (`{one}`, `{many}`,
/// `{system}` filled in).
const VERBS: &[(&str, bool, &str)] = &[
    ("list", true, "List {many} in {system}."),
    (
        "get",
        false,
        "Get a single {one} by its ID, with all of its fields.",
    ),
    (
        "search",
        true,
        "Search {many} by keyword, owner or date range.",
    ),
    ("create", false, "Create a new {one} in {system}."),
    (
        "update",
        false,
        "Update fields of an existing {one}; fields left out are unchanged.",
    ),
    ("delete", false, "Permanently delete a {one}."),
    (
        "archive",
        false,
        "Archive a {one} so it no longer appears in default views.",
    ),
    (
        "export",
        true,
        "Export {many} as CSV or JSON for use in spreadsheets.",
    ),
    (
        "count",
        true,
        "Count {many} matching a filter without fetching them.",
    ),
    ("sync", true, "Synchronise {many} with {system}."),
];

const EXTRA_SENTENCES: &[&str] = &[
    "Results are sorted by most recently updated first.",
    "Requires write access to the workspace.",
    "Pass the cursor from the previous response to fetch the next page.",
    "Deleted items are kept for 30 days before they are purged.",
    "Rate limited to 100 requests per minute per token.",
    "Timestamps are ISO 8601 strings in UTC.",
    "Returns at most 100 items per call.",
    "Changes are recorded in the audit log.",
    "Large results are truncated; narrow the filter to see everything.",
    "Fields that the caller may not read are omitted from the result.",
];

/// The optional parameters a tool may take (name, schema), beyond its own id.
fn parameter_pool(one: &str, many: &str) -> Vec<(String, Value)> {
    let words = |s: &str| s.replace('_', " ");
    vec![
        (
            "query".into(),
            json!({"type": "string", "description": format!("Free-text search over {} names and descriptions.", words(many))}),
        ),
        (
            "limit".into(),
            json!({"type": "integer", "minimum": 1, "maximum": 100, "default": 20, "description": "Maximum number of results to return."}),
        ),
        (
            "cursor".into(),
            json!({"type": "string", "description": "Pagination cursor from a previous response."}),
        ),
        (
            "status".into(),
            json!({"type": "string", "enum": ["open", "pending", "closed", "archived"], "description": format!("Only {} in this state.", words(many))}),
        ),
        (
            "sort_by".into(),
            json!({"type": "string", "enum": ["created_at", "updated_at", "name", "priority"], "description": "Field to sort the results by."}),
        ),
        (
            "order".into(),
            json!({"type": "string", "enum": ["asc", "desc"], "default": "desc"}),
        ),
        (
            "owner_id".into(),
            json!({"type": "string", "description": format!("ID of the user who owns the {}.", words(one))}),
        ),
        (
            "tags".into(),
            json!({"type": "array", "items": {"type": "string"}, "description": "Tags to match; all must be present."}),
        ),
        (
            "created_after".into(),
            json!({"type": "string", "format": "date-time", "description": "Only items created after this time (ISO 8601)."}),
        ),
        (
            "include_archived".into(),
            json!({"type": "boolean", "default": false, "description": "Whether archived items are included."}),
        ),
        (
            "fields".into(),
            json!({"type": "object", "description": format!("The {}'s fields to set.", words(one)), "properties": {
            "name": {"type": "string", "description": "Display name."},
            "email": {"type": "string", "format": "email"},
            "priority": {"type": "integer", "minimum": 1, "maximum": 5},
            "custom": {"type": "object", "additionalProperties": {"type": "string"}}},
            "required": ["name"]}),
        ),
        (
            "filter".into(),
            json!({"type": "object", "description": "A condition on one field.", "properties": {
            "field": {"type": "string"},
            "operator": {"type": "string", "enum": ["eq", "neq", "gt", "lt", "contains"]},
            "value": {"type": ["string", "number", "boolean"]}},
            "required": ["field", "operator", "value"]}),
        ),
        (
            "line_items".into(),
            json!({"type": "array", "description": "Items to attach.", "items": {"type": "object", "properties": {
            "sku": {"type": "string", "description": "Stock keeping unit."},
            "quantity": {"type": "integer", "minimum": 1}}, "required": ["sku", "quantity"]}}),
        ),
        (
            "dry_run".into(),
            json!({"type": "boolean", "description": "Validate only; change nothing."}),
        ),
        (
            "format".into(),
            json!({"type": "string", "enum": ["csv", "json", "ndjson"], "description": "Output format."}),
        ),
        (
            "metadata".into(),
            json!({"type": "object", "additionalProperties": {"type": "string"}, "description": "Free-form key/value pairs."}),
        ),
        (
            "notify".into(),
            json!({"type": "boolean", "description": format!("Notify watchers of the {}.", words(one))}),
        ),
        (
            "timezone".into(),
            json!({"type": "string", "description": "IANA timezone for dates, such as Europe/Paris."}),
        ),
    ]
}

/// `owner_id` → `ownerId`, for servers written in camelCase.
fn camel(name: &str) -> String {
    let mut out = String::new();
    for (i, part) in name.split('_').enumerate() {
        let mut chars = part.chars();
        match chars.next() {
            Some(c) if i > 0 => out.extend(c.to_uppercase().chain(chars)),
            Some(c) => out.extend(std::iter::once(c).chain(chars)),
            None => {}
        }
    }
    out
}

fn title_case(name: &str) -> String {
    name.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map_or(String::new(), |f| f.to_uppercase().chain(c).collect())
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn input_schema(rng: &mut Rng, verb: &str, one: &str, many: &str, camel_case: bool) -> Value {
    let key = |k: &str| if camel_case { camel(k) } else { k.to_string() };
    let mut props = Map::new();
    let mut required = Vec::new();
    if !matches!(
        verb,
        "list" | "search" | "create" | "export" | "count" | "sync"
    ) {
        let id = key(&format!("{one}_id"));
        let description = format!("The ID of the {}.", one.replace('_', " "));
        props.insert(
            id.clone(),
            json!({"type": "string", "description": description}),
        );
        required.push(id);
    }
    let mut pool = parameter_pool(one, many);
    rng.shuffle(&mut pool);
    let wanted = 1 + rng.below(8);
    for (name, schema) in pool.into_iter().take(wanted.saturating_sub(props.len())) {
        let name = key(&name);
        if rng.chance(20) {
            required.push(name.clone());
        }
        props.insert(name, schema);
    }
    json!({"type": "object", "properties": props, "required": required})
}

fn output_schema(rng: &mut Rng, plural: bool) -> Option<Value> {
    if !rng.chance(35) {
        return None;
    }
    let item = json!({"type": "object", "properties": {
        "id": {"type": "string"}, "name": {"type": "string"},
        "updated_at": {"type": "string", "format": "date-time"}}, "required": ["id"]});
    Some(if plural {
        json!({"type": "object", "properties": {"items": {"type": "array", "items": item},
               "next_cursor": {"type": ["string", "null"]}}, "required": ["items"]})
    } else {
        item
    })
}

fn description(rng: &mut Rng, template: &str, one: &str, many: &str, system: &str) -> String {
    let mut sentences = vec![template
        .replace("{one}", &one.replace('_', " "))
        .replace("{many}", &many.replace('_', " "))
        .replace("{system}", system)];
    for _ in 0..rng.below(3) {
        let extra = rng.pick(EXTRA_SENTENCES).to_string();
        if !sentences.contains(&extra) {
            sentences.push(extra);
        }
    }
    sentences.join(" ")
}

/// The tools of one server.
fn server_tools(rng: &mut Rng, domain: &Domain, server: &str, count: usize) -> Vec<CatalogTool> {
    let mut combos: Vec<(usize, usize)> = (0..VERBS.len())
        .flat_map(|v| (0..domain.entities.len()).map(move |e| (v, e)))
        .collect();
    rng.shuffle(&mut combos);
    let camel_case = rng.chance(30);
    (0..count)
        .map(|i| {
            let (v, e) = combos[i % combos.len()];
            let (verb, plural, template) = VERBS[v];
            let (one, many) = domain.entities[e];
            let mut tool = format!("{verb}_{}", if plural { many } else { one });
            if i >= combos.len() {
                tool = format!("{tool}_v{}", i / combos.len() + 1);
            }
            CatalogTool {
                name: format!("{server}__{tool}"),
                server: server.to_string(),
                server_ident: server.to_string(),
                title: rng.chance(30).then(|| title_case(&tool)),
                description: Some(description(rng, template, one, many, domain.system)),
                input_schema: input_schema(rng, verb, one, many, camel_case),
                output_schema: output_schema(rng, plural),
                annotations: None,
                tool_ident: tool.clone(),
                tool,
            }
        })
        .collect()
}

/// A catalog of `n` tools over about `n / 20` servers (at least one), the same for the
/// same `n` and `seed`; its version is 1.
pub fn synthetic_catalog(n: usize, seed: u64) -> Catalog {
    let mut rng = Rng::new(seed);
    let servers = ((n + 10) / 20).max(1);
    let mut tools = Vec::with_capacity(n);
    for s in 0..servers {
        let count = n / servers + usize::from(s < n % servers);
        let domain = &DOMAINS[s % DOMAINS.len()];
        let server = match s / DOMAINS.len() {
            0 => domain.server.to_string(),
            k if k <= VARIANTS.len() => format!("{}_{}", domain.server, VARIANTS[k - 1]),
            k => format!("{}_{k}", domain.server),
        };
        tools.extend(server_tools(&mut rng, domain, &server, count));
    }
    Catalog {
        version: 1,
        tools,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn sizes_servers_and_unique_names() {
        for n in [0, 1, 19, 100, 1_000, 10_000] {
            let c = synthetic_catalog(n, 7);
            assert_eq!(c.tools.len(), n);
            let names: BTreeSet<&str> = c.tools.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names.len(), n, "names are unique");
            let servers: BTreeSet<&str> = c.tools.iter().map(|t| t.server.as_str()).collect();
            if n >= 100 {
                assert_eq!(servers.len(), (n + 10) / 20);
            }
            for t in &c.tools {
                assert_eq!(t.name, format!("{}__{}", t.server_ident, t.tool_ident));
                assert!(t
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_'));
            }
        }
    }

    #[test]
    fn deterministic_for_a_seed() {
        let a = synthetic_catalog(300, 42);
        assert!(a.tools == synthetic_catalog(300, 42).tools);
        assert!(a.tools != synthetic_catalog(300, 43).tools);
    }

    #[test]
    fn realistic_shapes() {
        let c = synthetic_catalog(1_000, 1);
        assert!(c.tools.iter().any(|t| t.name.starts_with("crm__search_")));
        for t in &c.tools {
            let verb = t.tool.split('_').next().unwrap();
            assert!(VERBS.iter().any(|v| v.0 == verb), "{}", t.name);
        }
        let mut kinds = BTreeSet::new();
        let mut outputs = 0;
        for t in &c.tools {
            let sentences = t.description.as_deref().unwrap().matches(". ").count() + 1;
            assert!((1..=3).contains(&sentences), "{:?}", t.description);
            let props = t.input_schema["properties"].as_object().unwrap();
            assert!(
                (1..=8).contains(&props.len()),
                "{}: {}",
                t.name,
                props.len()
            );
            for p in props.values() {
                if p.get("enum").is_some() {
                    kinds.insert("enum");
                }
                if let Some(k) = p.get("type").and_then(Value::as_str) {
                    kinds.insert(k);
                }
                if p.get("properties").is_some() {
                    kinds.insert("nested");
                }
            }
            outputs += usize::from(t.output_schema.is_some());
        }
        for kind in [
            "string", "integer", "boolean", "array", "object", "enum", "nested",
        ] {
            assert!(kinds.contains(kind), "{kind} missing");
        }
        assert!((200..500).contains(&outputs), "{outputs} output schemas");
        assert!(c.tools.iter().any(|t| t.title.is_some()));
        assert!(c
            .tools
            .iter()
            .any(|t| t.input_schema["properties"].get("ownerId").is_some()));
    }
}
