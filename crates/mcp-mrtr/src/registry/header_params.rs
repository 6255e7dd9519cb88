//! `x-mcp-header` annotations in a tool's input schema: the parameters a client mirrors into
//! `Mcp-Param-{name}` headers, found and checked against the constraints of the 2026-07-28
//! Streamable HTTP transport. A client must drop a tool whose annotations break them, so a tool
//! that does is refused when it is built, not found missing by its users.

use std::collections::HashSet;

use serde_json::{Map, Value};

/// A tool parameter mirrored into an `Mcp-Param-{name}` header (`x-mcp-header` in its schema).
#[derive(Debug, Clone, PartialEq)]
pub struct HeaderParam {
    /// The header's name after `Mcp-Param-`, as given by `x-mcp-header`.
    pub header: String,
    /// The chain of `properties` keys leading to the parameter.
    pub path: Vec<String>,
}

/// The annotation's key in a property's schema.
const ANNOTATION: &str = "x-mcp-header";

/// Keywords whose value is one subschema (`items` may also be a list, as before 2020-12).
const ONE_SCHEMA: [&str; 12] = [
    "items",
    "additionalItems",
    "contentSchema",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
];

/// Keywords whose value is a list of subschemas.
const SCHEMA_LISTS: [&str; 4] = ["anyOf", "oneOf", "allOf", "prefixItems"];

/// Keywords whose value maps names to subschemas (other than `properties`; draft-07's
/// `dependencies` may map to a list of names instead, which holds no schema).
const SCHEMA_MAPS: [&str; 5] = [
    "patternProperties",
    "dependentSchemas",
    "dependencies",
    "$defs",
    "definitions",
];

/// The annotated parameters of `schema`, or why its annotations break the transport's rules:
/// a name that is empty, not an HTTP token, or given twice (case aside); a parameter not of type
/// string, integer or boolean (a `type`, or else `enum` or `const` values all of one of those);
/// an annotation not reached from the root through `properties` alone. [`Tool`] constructors
/// panic on such a schema; check one that comes from elsewhere first.
///
/// [`Tool`]: super::Tool
pub fn header_params(schema: &Value) -> Result<Vec<HeaderParam>, String> {
    let mut found = Vec::new();
    walk(schema, &mut Vec::new(), true, &mut found)?;
    let mut names = HashSet::new();
    for param in &found {
        if !names.insert(param.header.to_ascii_lowercase()) {
            return Err(format!(
                "{ANNOTATION} \"{}\" is given to more than one parameter (names are compared \
                 without case)",
                param.header
            ));
        }
    }
    Ok(found)
}

/// Visits the schema at `path`, `reachable` while every step so far was a `properties` key.
fn walk(
    schema: &Value,
    path: &mut Vec<String>,
    reachable: bool,
    found: &mut Vec<HeaderParam>,
) -> Result<(), String> {
    let Some(schema) = schema.as_object() else {
        return Ok(());
    };
    if let Some(annotation) = schema.get(ANNOTATION) {
        found.push(checked(schema, annotation, path, reachable)?);
    }
    for (keyword, value) in schema {
        match keyword.as_str() {
            "properties" => {
                for (name, property) in value.as_object().into_iter().flatten() {
                    path.push(name.clone());
                    walk(property, path, reachable, found)?;
                    path.pop();
                }
            }
            k if ONE_SCHEMA.contains(&k) || SCHEMA_LISTS.contains(&k) => match value {
                Value::Array(items) => {
                    for item in items {
                        walk_apart(item, path, keyword, found)?;
                    }
                }
                one => walk_apart(one, path, keyword, found)?,
            },
            k if SCHEMA_MAPS.contains(&k) => {
                for item in value.as_object().into_iter().flatten().map(|(_, v)| v) {
                    walk_apart(item, path, keyword, found)?;
                }
            }
            // Values (`enum`, `const`, `default`, `examples`) and other keywords hold no schema.
            _ => {}
        }
    }
    Ok(())
}

/// Visits a subschema under `keyword`, from which no annotation is statically reachable.
fn walk_apart(
    schema: &Value,
    path: &mut Vec<String>,
    keyword: &str,
    found: &mut Vec<HeaderParam>,
) -> Result<(), String> {
    path.push(format!("({keyword})"));
    let walked = walk(schema, path, false, found);
    path.pop();
    walked
}

/// The parameter an annotation names, if it keeps the rules.
fn checked(
    schema: &Map<String, Value>,
    annotation: &Value,
    path: &[String],
    reachable: bool,
) -> Result<HeaderParam, String> {
    let at = if path.is_empty() {
        "the schema's root".to_owned()
    } else {
        path.join(".")
    };
    if !reachable || path.is_empty() {
        return Err(format!(
            "{ANNOTATION} at {at}: only a property reached from the root through `properties` \
             alone may be mirrored into a header"
        ));
    }
    let Some(header) = annotation.as_str() else {
        return Err(format!("{ANNOTATION} at {at} must be a string"));
    };
    if header.is_empty() || !header.bytes().all(is_token_char) {
        return Err(format!(
            "{ANNOTATION} \"{}\" at {at} is not an HTTP field-name token (letters, digits and \
             !#$%&'*+-.^_`|~)",
            header.escape_default()
        ));
    }
    if primitive(schema) {
        Ok(HeaderParam {
            header: header.to_owned(),
            path: path.to_vec(),
        })
    } else {
        Err(format!(
            "{ANNOTATION} \"{header}\" at {at}: the parameter's type must be string, integer or \
             boolean"
        ))
    }
}

/// Whether the parameter is a string, an integer or a boolean: by its `type`, or, without one,
/// by the values its `enum` or `const` allow.
fn primitive(schema: &Map<String, Value>) -> bool {
    if let Some(kind) = schema.get("type") {
        return matches!(kind.as_str(), Some("string" | "integer" | "boolean"));
    }
    let values: Vec<&Value> = match (schema.get("enum"), schema.get("const")) {
        (Some(Value::Array(values)), None) => values.iter().collect(),
        (None, Some(value)) => vec![value],
        _ => return false,
    };
    let all = |test: fn(&Value) -> bool| !values.is_empty() && values.iter().all(|v| test(v));
    all(Value::is_string) || all(|v| v.is_i64() || v.is_u64()) || all(Value::is_boolean)
}

/// RFC 9110's `tchar`.
fn is_token_char(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn with_property(property: Value) -> Value {
        json!({"type": "object", "properties": {"p": property}})
    }

    #[test]
    fn annotations_are_found_with_their_paths() {
        let schema = json!({
            "type": "object",
            "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"},
                "target": {"type": "object", "properties": {"zone": {"type": "integer", "x-mcp-header": "Zone"}}},
                "x-mcp-header": {"type": "string"},
            },
            "default": {"x-mcp-header": "not a schema"}
        });
        let params = header_params(&schema).expect("valid annotations");
        assert_eq!(params.len(), 2);
        assert!(params.contains(&HeaderParam {
            header: "Region".into(),
            path: vec!["region".into()]
        }));
        assert!(params.contains(&HeaderParam {
            header: "Zone".into(),
            path: vec!["target".into(), "zone".into()]
        }));
    }

    #[test]
    fn annotations_breaking_the_rules_are_refused_with_the_reason() {
        let refused = |schema: Value, because: &str| {
            let error = header_params(&schema).expect_err("refused");
            assert!(error.contains(because), "{error}");
        };
        refused(
            with_property(json!({"type": "string", "x-mcp-header": ""})),
            "not an HTTP field-name token",
        );
        refused(
            with_property(json!({"type": "string", "x-mcp-header": "Two Words"})),
            "not an HTTP field-name token",
        );
        refused(
            with_property(json!({"type": "string", "x-mcp-header": "Line\r\nBreak"})),
            "not an HTTP field-name token",
        );
        refused(
            with_property(json!({"type": "string", "x-mcp-header": 7})),
            "must be a string",
        );
        for kind in [json!("number"), json!("object"), json!(["string", "null"])] {
            refused(
                with_property(json!({"type": kind, "x-mcp-header": "P"})),
                "must be string, integer or boolean",
            );
        }
        refused(
            json!({"type": "object", "properties": {
                "a": {"type": "string", "x-mcp-header": "Region"},
                "b": {"type": "string", "x-mcp-header": "region"},
            }}),
            "more than one parameter",
        );
        refused(
            json!({"type": "object", "properties": {"list": {"type": "array",
                "items": {"type": "object", "properties": {"q": {"type": "string", "x-mcp-header": "Q"}}}}}}),
            "list.(items).q",
        );
        refused(
            json!({"type": "object", "anyOf": [{"properties": {"q": {"type": "string", "x-mcp-header": "Q"}}}]}),
            "(anyOf).q",
        );
        refused(
            json!({"type": "string", "x-mcp-header": "Root"}),
            "the schema's root",
        );
        let misplaced = json!({"type": "string", "x-mcp-header": "Q"});
        for (keyword, holder) in [
            ("$defs", json!({"$defs": {"q": misplaced}})),
            ("not", json!({"not": misplaced})),
            ("then", json!({"if": {}, "then": misplaced})),
            ("prefixItems", json!({"prefixItems": [misplaced]})),
            ("items", json!({"items": [misplaced]})),
            (
                "dependencies",
                json!({"dependencies": {"a": misplaced, "b": ["a"]}}),
            ),
        ] {
            let mut schema = json!({"type": "object", "properties": {}});
            if let (Some(schema), Some(holder)) = (schema.as_object_mut(), holder.as_object()) {
                schema.extend(holder.clone());
            }
            refused(schema, &format!("({keyword})"));
        }
    }

    #[test]
    fn properties_named_like_keywords_are_properties() {
        let schema = json!({"type": "object", "properties": {
            "items": {"type": "string", "x-mcp-header": "Items"},
            "anyOf": {"type": "object", "properties": {"not": {"type": "boolean", "x-mcp-header": "Not"}}},
        }});
        let params = header_params(&schema).expect("valid annotations");
        let paths: Vec<Vec<String>> = params.into_iter().map(|p| p.path).collect();
        assert!(paths.contains(&vec!["items".to_owned()]), "{paths:?}");
        assert!(
            paths.contains(&vec!["anyOf".to_owned(), "not".to_owned()]),
            "{paths:?}"
        );
    }

    #[test]
    fn a_parameter_without_a_type_is_primitive_by_its_values() {
        for property in [
            json!({"enum": ["eu", "us"], "x-mcp-header": "Region"}),
            json!({"const": 3, "x-mcp-header": "Region"}),
        ] {
            assert!(header_params(&with_property(property)).is_ok());
        }
        for property in [
            json!({"enum": ["eu", 3], "x-mcp-header": "Region"}),
            json!({"enum": [1.5], "x-mcp-header": "Region"}),
            json!({"anyOf": [{"type": "string"}, {"type": "null"}], "x-mcp-header": "Region"}),
        ] {
            assert!(header_params(&with_property(property)).is_err());
        }
    }
}
