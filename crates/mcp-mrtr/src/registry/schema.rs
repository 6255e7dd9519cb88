//! JSON schemas for tool inputs and outputs that every client and model provider can read.
//!
//! Function-calling dialects differ in what they accept: several reject `$ref`/`$defs`, some
//! reject `type` arrays, and non-standard `format` values (`int64`, `double`, `uint`) trip strict
//! linters. So the schemas generated here are self-contained (every subschema inlined), write a
//! nullable field as an `anyOf` of single types, and keep only the formats JSON Schema defines.
//! Doc comments become descriptions as paragraphs: their line breaks are folded into spaces.

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use schemars::transform::RestrictFormats;
use serde_json::{Map, Value, json};

/// Keywords that describe a property as a whole and stay beside an `anyOf`, not inside it
/// (an `x-mcp-header` moved inside would read as misplaced rather than on a nullable parameter).
const ANNOTATIONS: [&str; 5] = [
    "title",
    "description",
    "default",
    "examples",
    "x-mcp-header",
];

/// The schema of the arguments a tool deserializes into `T`.
pub fn input_schema_of<T: JsonSchema>() -> Value {
    portable(SchemaSettings::draft2020_12().for_deserialize(), |g| {
        g.into_root_schema_for::<T>()
    })
}

/// The schema of the `structuredContent` a tool serializes from `T`.
pub fn output_schema_of<T: JsonSchema>() -> Value {
    portable(SchemaSettings::draft2020_12().for_serialize(), |g| {
        g.into_root_schema_for::<T>()
    })
}

fn portable(
    settings: SchemaSettings,
    generate: impl FnOnce(schemars::SchemaGenerator) -> schemars::Schema,
) -> Value {
    let generator = settings
        .with(|s| s.inline_subschemas = true)
        .with_transform(RestrictFormats::default())
        .into_generator();
    let mut schema = generate(generator).to_value();
    split_type_arrays(&mut schema);
    fold_descriptions(&mut schema);
    if let Some(object) = schema.as_object_mut() {
        // The tool's own title and description speak for the root.
        object.remove("$schema");
        object.remove("title");
        object.remove("description");
        object.entry("type").or_insert_with(|| json!("object"));
        if object.get("type") == Some(&json!("object")) {
            object.entry("properties").or_insert_with(|| json!({}));
        }
    }
    schema
}

/// Rewrites every `{"type": [A, B, …], …}` as `{"anyOf": [{"type": A, …}, {"type": B, …}]}`,
/// keeping each type's own keywords in its branch (a `null` branch gets none).
fn split_type_arrays(schema: &mut Value) {
    match schema {
        Value::Array(items) => items.iter_mut().for_each(split_type_arrays),
        Value::Object(object) => {
            object.values_mut().for_each(split_type_arrays);
            let Some(Value::Array(types)) = object.get("type").cloned() else {
                return;
            };
            object.remove("type");
            let mut outer = Map::new();
            for keyword in ANNOTATIONS {
                if let Some(value) = object.remove(keyword) {
                    outer.insert(keyword.to_owned(), value);
                }
            }
            let branches = types
                .into_iter()
                .map(|kind| branch_for(kind, object))
                .collect();
            outer.insert("anyOf".to_owned(), Value::Array(branches));
            *object = outer;
        }
        _ => {}
    }
}

/// Joins the lines of every `description` within a paragraph; blank lines still part paragraphs.
fn fold_descriptions(schema: &mut Value) {
    match schema {
        Value::Array(items) => items.iter_mut().for_each(fold_descriptions),
        Value::Object(object) => {
            if let Some(Value::String(text)) = object.get_mut("description") {
                *text = text
                    .split("\n\n")
                    .map(|paragraph| {
                        paragraph
                            .split('\n')
                            .map(str::trim)
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .collect::<Vec<_>>()
                    .join("\n\n");
            }
            object.values_mut().for_each(fold_descriptions);
        }
        _ => {}
    }
}

fn branch_for(kind: Value, keywords: &Map<String, Value>) -> Value {
    if kind == "null" {
        return json!({"type": "null"});
    }
    let mut branch = keywords.clone();
    if let Some(Value::Array(allowed)) = branch.get_mut("enum") {
        allowed.retain(|value| !value.is_null());
    }
    branch.insert("type".to_owned(), kind);
    Value::Object(branch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Deserialize, Serialize, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Outer {
        /// How
        /// many.
        count: i64,
        /// Perhaps a score.
        score: Option<f64>,
        inner: Inner,
        maybe_inner: Option<Inner>,
        choice: Option<Choice>,
    }

    #[derive(Deserialize, Serialize, JsonSchema)]
    #[allow(dead_code)]
    struct Inner {
        name: String,
    }

    #[derive(Deserialize, Serialize, JsonSchema)]
    #[allow(dead_code)]
    enum Choice {
        Yes,
        No,
    }

    fn walk<'a>(schema: &'a Value, seen: &mut Vec<&'a Value>) {
        seen.push(schema);
        match schema {
            Value::Array(items) => items.iter().for_each(|v| walk(v, seen)),
            Value::Object(object) => object.values().for_each(|v| walk(v, seen)),
            _ => {}
        }
    }

    #[test]
    fn schemas_are_self_contained_with_single_types_and_standard_formats() {
        for schema in [input_schema_of::<Outer>(), output_schema_of::<Outer>()] {
            let text = schema.to_string();
            assert!(!text.contains("$ref") && !text.contains("$defs"), "{text}");
            let mut nodes = Vec::new();
            walk(&schema, &mut nodes);
            for node in nodes {
                if let Some(kind) = node.get("type") {
                    assert!(kind.is_string(), "a single type: {node}");
                }
                if let Some(format) = node.get("format") {
                    assert!(!["int64", "double"].contains(&format.as_str().unwrap_or("")));
                }
            }
            let score = &schema["properties"]["score"];
            assert_eq!(score["description"], "Perhaps a score.", "{score}");
            assert_eq!(
                score["anyOf"],
                json!([{"type": "number"}, {"type": "null"}]),
                "{score}"
            );
            let count = &schema["properties"]["count"];
            assert_eq!(
                count,
                &json!({"type": "integer", "description": "How many."})
            );
            let choice = &schema["properties"]["choice"];
            assert!(
                choice["anyOf"].is_array(),
                "nullable enum as anyOf: {choice}"
            );
            let values: Vec<&Value> = choice["anyOf"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|branch| branch.get("enum"))
                .flat_map(|allowed| allowed.as_array().into_iter().flatten())
                .collect();
            assert_eq!(values, [&json!("Yes"), &json!("No")], "{choice}");
        }
    }
}
