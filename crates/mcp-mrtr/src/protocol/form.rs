//! Accepted form content checked against the form's requested schema, as the elicitation spec
//! asks servers to ("validate received data matches the requested schema"). A form schema is flat:
//! each property is a string (with a length, a `format`, or one of `enum` / `oneOf` consts), a
//! number or integer (with bounds), a boolean, or an array of strings chosen from a list. Each
//! value the client sent for a declared property is checked; properties the schema does not
//! declare, and keywords that do not constrain (`default`, `enumNames`), are left alone.
//! Required properties left out, or sent as null (as some forms send an untouched field), are
//! not refused here: an empty form is an answer the handler decides about (it may take a
//! fallback or ask again). A `date-time` is RFC 3339's, with its offset: a browser's
//! `datetime-local` value (`2026-12-07T10:00`) is not one.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::{Map, Value, json};

/// Most choices an error message lists.
const CHOICES_LISTED: usize = 10;

/// Why `schema` is not a form a server may ask with, if it is not: the spec's forms are flat, an
/// object whose properties are each a string, a number, an integer, a boolean, or a list of
/// strings chosen from an `enum` or titled `anyOf` consts (a string's own choices are strings
/// too). The keywords the wire schema gives a kind (`title`, `description`, `default`,
/// `format`, bounds) must hold values of the kind it says; others are left to the client.
pub fn not_a_form(schema: &Value) -> Option<String> {
    let Some(schema) = schema.as_object() else {
        return Some("requestedSchema must be a JSON object".into());
    };
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Some("requestedSchema must have \"type\": \"object\"".into());
    }
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Some("requestedSchema must list its fields in a \"properties\" object".into());
    };
    if let Some(required) = schema.get("required")
        && !required
            .as_array()
            .is_some_and(|names| names.iter().all(Value::is_string))
    {
        return Some("requestedSchema's \"required\" must be a list of property names".into());
    }
    properties.iter().find_map(|(name, property)| {
        let why = not_a_field(property)?;
        Some(format!("requestedSchema's property {name} {why}"))
    })
}

/// A keyword of a field, the kind of value the wire schema gives it, and a test of that kind.
type Keyword = (&'static str, &'static str, fn(&Value) -> bool);

/// Keywords every kind of field may carry.
const LABELS: [Keyword; 2] = [
    ("title", "a string", Value::is_string),
    ("description", "a string", Value::is_string),
];

/// Why a property's schema is not one a form can hold, if it is not.
fn not_a_field(property: &Value) -> Option<String> {
    let Some(property) = property.as_object() else {
        return Some("must be a JSON object".into());
    };
    let keywords: &[Keyword] = match property.get("type") {
        Some(Value::String(kind)) if kind == "string" => {
            if !string_choices(property) {
                return Some("offers choices that are not strings".into());
            }
            &[
                ("default", "a string", Value::is_string),
                ("minLength", "an integer", is_integer),
                ("maxLength", "an integer", is_integer),
                ("format", "one of date, date-time, email, uri", |format| {
                    matches!(
                        format.as_str(),
                        Some("date" | "date-time" | "email" | "uri")
                    )
                }),
                ("enumNames", "a list of strings", is_string_list),
            ]
        }
        Some(Value::String(kind)) if matches!(kind.as_str(), "number" | "integer") => &[
            ("default", "a number", Value::is_number),
            ("minimum", "a number", Value::is_number),
            ("maximum", "a number", Value::is_number),
        ],
        Some(Value::String(kind)) if kind == "boolean" => {
            &[("default", "true or false", Value::is_boolean)]
        }
        Some(Value::String(kind)) if kind == "array" => {
            let Some(items) = property.get("items").and_then(Value::as_object) else {
                return Some("is a list without \"items\" to choose from".into());
            };
            if !(untitled_choices(items) || titled_choices(items)) {
                return Some(
                    "is a list, which a form holds only as strings chosen from an enum or from titled anyOf consts"
                        .into(),
                );
            }
            &[
                ("default", "a list of strings", is_string_list),
                ("minItems", "an integer", is_integer),
                ("maxItems", "an integer", is_integer),
            ]
        }
        Some(_) => {
            return Some(
                "has a type a form cannot hold (string, number, integer, boolean, or a list of choices)"
                    .into(),
            );
        }
        None => return Some("has no \"type\"".into()),
    };
    LABELS
        .iter()
        .chain(keywords)
        .find_map(|(keyword, kind, fits)| {
            let value = property.get(*keyword)?;
            (!fits(value)).then(|| format!("has a \"{keyword}\" that is not {kind}"))
        })
}

/// Whether a string field's choices, if it lists any, are strings: each `enum` value, and each
/// `oneOf` / `anyOf` branch a `{"const": "…"}` (titled or not: the wire's plain string field
/// takes both), not a schema of its own.
fn string_choices(schema: &Map<String, Value>) -> bool {
    schema.get("enum").is_none_or(is_string_list)
        && ["oneOf", "anyOf"].iter().all(|keyword| {
            schema
                .get(*keyword)
                .is_none_or(|listed| is_const_list(listed, false))
        })
}

/// The items of an untitled multi-select: `{"type": "string", "enum": [...]}`.
fn untitled_choices(items: &Map<String, Value>) -> bool {
    items.get("type").is_some_and(|kind| kind == "string")
        && items.get("enum").is_some_and(is_string_list)
}

/// The items of a titled multi-select: `{"anyOf": [{"const": "…", "title": "…"}, ...]}`.
fn titled_choices(items: &Map<String, Value>) -> bool {
    items
        .get("anyOf")
        .is_some_and(|listed| is_const_list(listed, true))
        && items.get("type").is_none_or(|kind| kind == "string")
        && !items.contains_key("oneOf")
}

/// A list of string consts, each `{"const": "…", "title": "…"}`, the title a string when given
/// and given when `titled`.
fn is_const_list(listed: &Value, titled: bool) -> bool {
    listed.as_array().is_some_and(|all| {
        all.iter().all(|branch| {
            let title = branch.get("title");
            branch.get("const").is_some_and(Value::is_string)
                && title.map_or(!titled, Value::is_string)
                && branch.get("type").is_none_or(|kind| kind == "string")
                && branch.get("properties").is_none()
        })
    })
}

fn is_string_list(value: &Value) -> bool {
    value
        .as_array()
        .is_some_and(|all| all.iter().all(Value::is_string))
}

/// An integer as JSON Schema counts them: a number without a fraction (`2.0` is one).
fn is_integer(value: &Value) -> bool {
    value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|n| n.fract() == 0.0)
}

/// Why `content` does not fit `schema` (the first value found that does not), naming the
/// property.
pub fn misfit(schema: &Value, content: &Map<String, Value>) -> Option<String> {
    let properties = schema.get("properties")?.as_object()?;
    content.iter().find_map(|(name, value)| {
        if value.is_null() {
            return None;
        }
        let property = properties.get(name)?.as_object()?;
        let why = value_misfit(property, value)?;
        Some(format!("{name} {why}"))
    })
}

/// Why `value` does not fit the property's schema, if it does not.
fn value_misfit(property: &Map<String, Value>, value: &Value) -> Option<String> {
    match property.get("type").and_then(Value::as_str)? {
        "string" => {
            let Some(text) = value.as_str() else {
                return Some("must be a string".into());
            };
            let length = text.chars().count() as u64;
            if let Some(least) = bound(property, "minLength").filter(|least| length < *least as u64)
            {
                return Some(format!("must be at least {least} characters long"));
            }
            if let Some(most) = bound(property, "maxLength").filter(|most| length > *most as u64) {
                return Some(format!("must be at most {most} characters long"));
            }
            if let Some(format) = property.get("format").and_then(Value::as_str)
                && let Some(checker) = FORMATS.get(format)
                && !checker.is_valid(value)
            {
                return Some(format!("must be a valid {format}"));
            }
            not_among(&choices(property), value)
        }
        "number" | "integer" => {
            let Some(number) = value.as_f64() else {
                return Some("must be a number".into());
            };
            if property.get("type").and_then(Value::as_str) == Some("integer")
                && number.fract() != 0.0
            {
                return Some("must be an integer".into());
            }
            if let Some(least) = bound(property, "minimum").filter(|least| number < *least) {
                return Some(format!("must be at least {least}"));
            }
            if let Some(most) = bound(property, "maximum").filter(|most| number > *most) {
                return Some(format!("must be at most {most}"));
            }
            None
        }
        "boolean" => (!value.is_boolean()).then(|| "must be true or false".into()),
        "array" => {
            let Some(items) = value.as_array() else {
                return Some("must be a list of strings".into());
            };
            if items.iter().any(|item| !item.is_string()) {
                return Some("must be a list of strings".into());
            }
            let count = items.len() as f64;
            if let Some(least) = bound(property, "minItems").filter(|least| count < *least) {
                return Some(format!("must have at least {least} selected"));
            }
            if let Some(most) = bound(property, "maxItems").filter(|most| count > *most) {
                return Some(format!("must have at most {most} selected"));
            }
            let allowed = property
                .get("items")
                .and_then(Value::as_object)
                .map(choices)
                .unwrap_or_default();
            items.iter().find_map(|item| not_among(&allowed, item))
        }
        // A type a form cannot hold: nothing to check it by.
        _ => None,
    }
}

/// A checker of each `format` a form's string may have, as JSON Schema defines them.
static FORMATS: LazyLock<HashMap<&'static str, jsonschema::Validator>> = LazyLock::new(|| {
    ["date", "date-time", "email", "uri"]
        .into_iter()
        .map(|format| {
            let checker = jsonschema::options()
                .should_validate_formats(true)
                .build(&json!({"type": "string", "format": format}))
                .unwrap_or_else(|e| unreachable!("a fixed schema compiles: {e}"));
            (format, checker)
        })
        .collect()
});

/// A numeric keyword of the property.
fn bound(property: &Map<String, Value>, keyword: &str) -> Option<f64> {
    property.get(keyword).and_then(Value::as_f64)
}

/// The values a property (or an array's items) allows: its `enum`, or the `const` of each
/// `oneOf` / `anyOf` branch; empty when it lists none.
fn choices(schema: &Map<String, Value>) -> Vec<&Value> {
    if let Some(Value::Array(values)) = schema.get("enum") {
        return values.iter().collect();
    }
    ["oneOf", "anyOf"]
        .iter()
        .filter_map(|keyword| schema.get(*keyword).and_then(Value::as_array))
        .flatten()
        .filter_map(|branch| branch.get("const"))
        .collect()
}

/// Why `value` is not one of `allowed` (none when the list is empty: any value goes).
fn not_among(allowed: &[&Value], value: &Value) -> Option<String> {
    if allowed.is_empty() || allowed.contains(&value) {
        return None;
    }
    let mut listed: Vec<String> = allowed
        .iter()
        .take(CHOICES_LISTED)
        .map(|choice| choice.to_string())
        .collect();
    if allowed.len() > CHOICES_LISTED {
        listed.push(format!("… ({} in all)", allowed.len()));
    }
    Some(format!("must be one of {}", listed.join(", ")))
}

/// `content` with each whole number sent for an integer property (`30.0`, `1e2`) written as the
/// integer it is, so that a handler reading it as one finds it.
pub fn integers_as_integers(schema: &Value, content: &mut Map<String, Value>) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, value) in content.iter_mut() {
        let integer = properties
            .get(name)
            .and_then(|property| property.get("type"))
            .and_then(Value::as_str)
            == Some("integer");
        if let Some(number) = value.as_f64().filter(|_| integer && value.is_f64())
            && number.fract() == 0.0
            && number.abs() < 9_007_199_254_740_992.0
        {
            // Within 2^53, where every whole f64 is an exact i64.
            *value = Value::from(number as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn form() -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 2, "maxLength": 5},
                "status": {"type": "string", "oneOf": [
                    {"const": "WANT_TO_WATCH", "title": "Want to watch"},
                    {"const": "WATCHED", "title": "Already watched"}]},
                "size": {"type": "string", "enum": ["S", "M"]},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "score": {"type": "number", "maximum": 10},
                "agree": {"type": "boolean"},
                "colours": {"type": "array", "maxItems": 2,
                            "items": {"anyOf": [{"const": "red", "title": "Red"},
                                                {"const": "blue", "title": "Blue"}]}},
                "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
                "email": {"type": "string", "format": "email"},
                "site": {"type": "string", "format": "uri"},
                "born": {"type": "string", "format": "date"},
                "at": {"type": "string", "format": "date-time"},
            },
            "required": ["name"]
        })
    }

    fn misfit_of(content: Value) -> Option<String> {
        let Value::Object(content) = content else {
            panic!("content is an object");
        };
        misfit(&form(), &content)
    }

    #[test]
    fn values_that_fit_pass_and_undeclared_or_missing_ones_are_left_alone() {
        assert_eq!(
            misfit_of(
                json!({"name": "Ana", "status": "WATCHED", "size": "M", "age": 30,
                             "score": 9.5, "agree": true, "colours": ["red", "blue"],
                             "tags": ["b"], "extra": {"nested": 1}, "email": "ana@example.org",
                             "site": "https://example.org/a?b=c", "born": "2024-02-29",
                             "at": "2026-12-07T10:00:00Z"})
            ),
            None
        );
        assert_eq!(misfit_of(json!({})), None, "required is the handler's call");
        assert_eq!(misfit_of(json!({"status": null})), None, "null is left out");
        assert_eq!(misfit_of(json!({"age": 30.0})), None, "30.0 is an integer");
        assert_eq!(misfit_of(json!({"age": 1e2})), None, "1e2 is an integer");
        let legacy = json!({"type": "object", "properties": {
            "when": {"type": "string", "format": "date", "default": "2026-01-01"},
            "pick": {"type": "string", "enum": ["opt1", "opt2"], "enumNames": ["One", "Two"]}}});
        let Value::Object(content) = json!({"when": "2026-12-07", "pick": "opt2"}) else {
            panic!("an object");
        };
        assert_eq!(misfit(&legacy, &content), None, "enumNames is not checked");
    }

    #[test]
    fn a_form_is_flat_and_each_field_primitive() {
        assert_eq!(not_a_form(&form()), None);
        let legacy_enum = json!({"type": "object", "properties": {
            "pick": {"type": "string", "enum": ["opt1", "opt2"], "enumNames": ["One", "Two"]},
            "when": {"type": "string", "format": "date", "default": "2026-01-01"}}});
        assert_eq!(not_a_form(&legacy_enum), None);
        assert_eq!(
            not_a_form(&json!({"type": "object", "properties": {}})),
            None,
            "a form may ask for nothing"
        );
        let empty_choice = json!({"type": "object", "properties": {
            "tags": {"type": "array", "items": {"type": "string", "enum": []}}}});
        assert_eq!(
            not_a_form(&empty_choice),
            None,
            "a list with no choices yet"
        );
        for (schema, why) in [
            (json!("form"), "requestedSchema must be a JSON object"),
            (
                json!({"properties": {}}),
                "requestedSchema must have \"type\": \"object\"",
            ),
            (
                json!({"type": "object"}),
                "requestedSchema must list its fields in a \"properties\" object",
            ),
            (
                json!({"type": "object", "properties": {}, "required": "name"}),
                "requestedSchema's \"required\" must be a list of property names",
            ),
            (
                json!({"type": "object", "properties": {"where": {"type": "object",
                    "properties": {"city": {"type": "string"}}}}}),
                "requestedSchema's property where has a type a form cannot hold (string, number, integer, boolean, or a list of choices)",
            ),
            (
                json!({"type": "object", "properties": {"name": {"title": "Name"}}}),
                "requestedSchema's property name has no \"type\"",
            ),
            (
                json!({"type": "object", "properties": {"name": true}}),
                "requestedSchema's property name must be a JSON object",
            ),
            (
                json!({"type": "object", "properties": {"size": {"type": "string", "enum": [1, 2]}}}),
                "requestedSchema's property size offers choices that are not strings",
            ),
            (
                json!({"type": "object", "properties": {"tags": {"type": "array"}}}),
                "requestedSchema's property tags is a list without \"items\" to choose from",
            ),
            (
                json!({"type": "object", "properties": {"tags": {"type": "array",
                    "items": {"type": "string"}}}}),
                "requestedSchema's property tags is a list, which a form holds only as strings chosen from an enum or from titled anyOf consts",
            ),
            (
                json!({"type": "object", "properties": {"size": {"type": "string",
                    "oneOf": [{"const": "S"}, {"type": "object"}]}}}),
                "requestedSchema's property size offers choices that are not strings",
            ),
            (
                json!({"type": "object", "properties": {"tags": {"type": "array",
                    "items": {"anyOf": [{"const": "a", "title": "A"}, {"type": "object", "properties": {}}]}}}}),
                "requestedSchema's property tags is a list, which a form holds only as strings chosen from an enum or from titled anyOf consts",
            ),
            (
                json!({"type": "object", "properties": {"name": {"type": ["string", "null"]}}}),
                "requestedSchema's property name has a type a form cannot hold (string, number, integer, boolean, or a list of choices)",
            ),
            (
                json!({"type": "object", "properties": {"points": {"type": "array",
                    "items": {"type": "object", "enum": [{"x": 1}]}}}}),
                "requestedSchema's property points is a list, which a form holds only as strings chosen from an enum or from titled anyOf consts",
            ),
        ] {
            assert_eq!(not_a_form(&schema).as_deref(), Some(why), "{schema}");
        }
    }

    /// Forms the wire schema refuses (`ElicitRequestFormParams`): multi-select choices without
    /// titles, by `oneOf` or without a `type` beside their `enum`, keywords of another kind; and
    /// a `format` other than the four the plain string field names.
    #[test]
    fn a_form_the_wire_schema_refuses_is_not_a_form() {
        let list = "is a list, which a form holds only as strings chosen from an enum or from titled anyOf consts";
        for (field, why) in [
            (
                json!({"type": "array", "items": {"anyOf": [{"const": "red"}]}}),
                list.to_owned(),
            ),
            (
                json!({"type": "array", "items": {"enum": ["a", "b"]}}),
                list.to_owned(),
            ),
            (
                json!({"type": "array", "items": {"oneOf": [{"const": "a", "title": "A"}]}}),
                list.to_owned(),
            ),
            (
                json!({"type": "string", "oneOf": [{"const": "S", "title": 5}]}),
                "offers choices that are not strings".to_owned(),
            ),
            (
                json!({"type": "string", "format": "ipv4"}),
                "has a \"format\" that is not one of date, date-time, email, uri".to_owned(),
            ),
            (
                json!({"type": "string", "minLength": 2.5}),
                "has a \"minLength\" that is not an integer".to_owned(),
            ),
            (
                json!({"type": "number", "default": "x"}),
                "has a \"default\" that is not a number".to_owned(),
            ),
            (
                json!({"type": "boolean", "default": "yes"}),
                "has a \"default\" that is not true or false".to_owned(),
            ),
            (
                json!({"type": "string", "title": 5}),
                "has a \"title\" that is not a string".to_owned(),
            ),
            (
                json!({"type": "array", "maxItems": 1.5,
                       "items": {"type": "string", "enum": ["a"]}}),
                "has a \"maxItems\" that is not an integer".to_owned(),
            ),
            (
                json!({"type": "array", "default": "a",
                       "items": {"type": "string", "enum": ["a"]}}),
                "has a \"default\" that is not a list of strings".to_owned(),
            ),
        ] {
            let schema = json!({"type": "object", "properties": {"f": field}});
            assert_eq!(
                not_a_form(&schema),
                Some(format!("requestedSchema's property f {why}")),
                "{schema}"
            );
        }
        let whole =
            json!({"type": "object", "properties": {"f": {"type": "string", "maxLength": 2.0}}});
        assert_eq!(not_a_form(&whole), None, "2.0 is an integer");
        let untitled_single = json!({"type": "object", "properties": {
            "size": {"type": "string", "oneOf": [{"const": "S"}, {"const": "L", "title": "Large"}]}}});
        assert_eq!(
            not_a_form(&untitled_single),
            None,
            "a plain string field's choices need no titles"
        );
    }

    #[test]
    fn whole_numbers_for_integer_properties_become_integers() {
        let Value::Object(mut content) =
            json!({"age": 30.0, "score": 9.0, "name": "Ana", "big": 1e300})
        else {
            panic!("an object");
        };
        let mut schema = form();
        schema["properties"]["big"] = json!({"type": "integer"});
        integers_as_integers(&schema, &mut content);
        assert_eq!(content["age"].as_i64(), Some(30));
        assert!(
            content["score"].is_f64(),
            "a number property keeps its float"
        );
        assert!(content["big"].is_f64(), "past 2^53 it is left as sent");
    }

    #[test]
    fn each_kind_of_misfit_is_named_with_its_property() {
        for (content, why) in [
            (
                json!({"status": "MAYBE"}),
                "status must be one of \"WANT_TO_WATCH\", \"WATCHED\"",
            ),
            (json!({"size": "XL"}), "size must be one of \"S\", \"M\""),
            (json!({"name": 7}), "name must be a string"),
            (
                json!({"name": "A"}),
                "name must be at least 2 characters long",
            ),
            (
                json!({"name": "Anastasia"}),
                "name must be at most 5 characters long",
            ),
            (json!({"age": "thirty"}), "age must be a number"),
            (json!({"age": 30.5}), "age must be an integer"),
            (json!({"age": -1}), "age must be at least 0"),
            (json!({"score": 11}), "score must be at most 10"),
            (json!({"agree": "yes"}), "agree must be true or false"),
            (
                json!({"colours": "red"}),
                "colours must be a list of strings",
            ),
            (
                json!({"colours": ["red", 1]}),
                "colours must be a list of strings",
            ),
            (
                json!({"colours": ["red", "green"]}),
                "colours must be one of \"red\", \"blue\"",
            ),
            (
                json!({"colours": ["red", "blue", "red"]}),
                "colours must have at most 2 selected",
            ),
            (json!({"tags": ["c"]}), "tags must be one of \"a\", \"b\""),
            (
                json!({"email": "not an address"}),
                "email must be a valid email",
            ),
            (json!({"site": "no scheme"}), "site must be a valid uri"),
            (json!({"born": "2026-02-30"}), "born must be a valid date"),
            (
                json!({"at": "2026-12-07 10:00"}),
                "at must be a valid date-time",
            ),
        ] {
            assert_eq!(
                misfit_of(content.clone()).as_deref(),
                Some(why),
                "{content}"
            );
        }
    }
}
