//! Checks real HTTP responses against api-spec/openapi.yaml (status documented, body valid).

use std::collections::BTreeSet;

use serde_json::Value;

pub struct Spec {
    pub doc: Value,
    pub seen: BTreeSet<(String, String)>,
}

impl Spec {
    pub fn load() -> Spec {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/api-spec/openapi.yaml"
        ))
        .unwrap();
        let doc: Value = serde_yaml_ng::from_str(&text).unwrap();
        Spec {
            doc,
            seen: BTreeSet::new(),
        }
    }

    fn resolve<'a>(&'a self, v: &'a Value) -> &'a Value {
        match v.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                let ptr = r.trim_start_matches('#');
                self.doc
                    .pointer(ptr)
                    .unwrap_or_else(|| panic!("dangling {r}"))
            }
            None => v,
        }
    }

    /// Checks one real response against the operation `method template`.
    pub fn check(
        &mut self,
        method: &str,
        template: &str,
        status: u16,
        content_type: &str,
        body: &[u8],
    ) {
        self.seen.insert((method.to_string(), template.to_string()));
        let op = &self.doc["paths"][template][method.to_lowercase()];
        assert!(op.is_object(), "{method} {template} is not in the spec");
        let resp = op["responses"].get(status.to_string()).unwrap_or_else(|| {
            panic!("{method} {template} answered {status}, which the spec does not document")
        });
        let resp = self.resolve(resp);
        let media = content_type.split(';').next().unwrap().trim();
        let schema = resp["content"].get(media).unwrap_or_else(|| {
            panic!("{method} {template} {status}: content type {media} not documented")
        })["schema"]
            .clone();
        let instance: Value = if media == "application/json" {
            serde_json::from_slice(body)
                .unwrap_or_else(|e| panic!("{method} {template}: not JSON: {e}"))
        } else {
            Value::String(String::from_utf8_lossy(body).into_owned())
        };
        let mut root = schema;
        if let Value::Object(m) = &mut root {
            m.insert("components".into(), self.doc["components"].clone());
        }
        let validator = jsonschema::validator_for(&root).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&instance)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{method} {template} {status} does not match the spec: {errors:?}\nbody: {instance:#}"
        );
    }

    pub fn operations(&self) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (path, item) in self.doc["paths"].as_object().unwrap() {
            for (m, _) in item.as_object().unwrap() {
                if ["get", "post", "delete", "put", "patch"].contains(&m.as_str()) {
                    out.insert((m.to_uppercase(), path.clone()));
                }
            }
        }
        out
    }
}
