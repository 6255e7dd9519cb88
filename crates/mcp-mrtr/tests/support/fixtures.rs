//! The test tools, prompts and resources the in-process server offers: each exercises one part
//! of the protocol (rounds, remembered work, progress, logging, cancellation, sampling, headers).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mcp_mrtr::mrtr::RequestContext;
use mcp_mrtr::protocol::LogLevel;
use mcp_mrtr::protocol::content::{
    CallToolResult, Content, GetPromptResult, PromptMessage, ReadResourceResult, ResourceContents,
};
use mcp_mrtr::protocol::input::{
    ElicitParams, Elicitation, InputRequest, Sampling, SamplingParams,
};
use mcp_mrtr::registry::{
    NoArguments, Prompt, PromptArgument, Registry, Resource, ResourceTemplate, Tool,
};
use mcp_mrtr::server::{Events, ServerEvent};
use serde_json::{Value, json};

/// How many prompt-list changes `flood_of_changes` announces before, and after, its resource
/// update: far more than a listen stream's socket, its queue of frames and the server's queue of
/// notices hold together.
pub const FLOOD_HALF: usize = 100_000;

use super::server::Probes;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct GreetArgs {
    /// The greeting to use, "Hello" by default.
    #[serde(default)]
    greeting: Option<String>,
}

fn text_form(field: &str) -> Value {
    json!({
        "type": "object",
        "properties": {field: {"type": "string"}},
        "required": [field]
    })
}

/// Marks `slow_progress` as dropped early when its future goes away before it finished.
struct DropProbe(Arc<Probes>);

impl Drop for DropProbe {
    fn drop(&mut self) {
        if !self.0.slow_finished.load(Ordering::SeqCst) {
            self.0.slow_dropped_early.store(true, Ordering::SeqCst);
        }
    }
}

/// The tools, prompt and resources the tests use.
pub(super) fn test_registry(probes: &Arc<Probes>, events: &Events) -> Registry {
    let mut registry = Registry::new();

    registry.add_tool(Tool::without_arguments(
        "simple_text",
        "Returns a fixed text",
        |_| async { Ok(CallToolResult::text("simple text")) },
    ));

    let greet_probes = probes.clone();
    registry.add_tool(Tool::new(
        "greet",
        "Asks the user's name (key user_name), then greets them; without form elicitation it greets a stranger",
        move |ctx, args: GreetArgs| {
            let probes = greet_probes.clone();
            async move {
                probes.greet_runs.fetch_add(1, Ordering::SeqCst);
                let greeting = args.greeting.unwrap_or_else(|| "Hello".into());
                let answer = ctx
                    .elicit("user_name", "What is your name?", text_form("name"))
                    .await?;
                let name = match &answer {
                    Elicitation::Unsupported => "stranger".to_owned(),
                    other => other.text("name").unwrap_or_else(|| "anonymous".into()),
                };
                Ok(CallToolResult::text(format!("{greeting}, {name}!")))
            }
        },
    ));

    registry.add_tool(Tool::without_arguments(
        "three_questions",
        "Asks name, colour and food in three rounds",
        |ctx| async move {
            let first = ctx
                .elicit("step1", "What is your name?", text_form("name"))
                .await?;
            let name = first.text("name").unwrap_or_default();
            let second = ctx
                .elicit(
                    "step2",
                    "What is your favourite colour?",
                    text_form("color"),
                )
                .await?;
            let color = second.text("color").unwrap_or_default();
            let third = ctx
                .elicit("step3", "What is your favourite food?", text_form("food"))
                .await?;
            let food = third.text("food").unwrap_or_default();
            Ok(CallToolResult::text(format!(
                "{name} likes {color} and {food}"
            )))
        },
    ));

    let lookup_probes = probes.clone();
    registry.add_tool(Tool::without_arguments(
        "remembered_lookup",
        "Does an expensive lookup once, then asks for a rating",
        move |ctx| {
            let probes = lookup_probes.clone();
            async move {
                let lookup: String = ctx
                    .remember("lookup", || async {
                        let run = probes.lookup_work_runs.fetch_add(1, Ordering::SeqCst) + 1;
                        Ok(format!("lookup #{run}"))
                    })
                    .await?;
                let form = json!({
                    "type": "object",
                    "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5}},
                    "required": ["stars"]
                });
                let answer = ctx.elicit("rating", "How many stars?", form).await?;
                let stars = answer.text("stars").unwrap_or_else(|| "no".into());
                Ok(CallToolResult::text(format!(
                    "{lookup}: rated {stars} stars"
                )))
            }
        },
    ));

    registry.add_tool(Tool::without_arguments(
        "progress_steps",
        "Reports progress 1, 2 and 3 of 3",
        |ctx| async move {
            for step in 1..=3 {
                ctx.progress(f64::from(step), Some(3.0), Some(&format!("step {step}")))
                    .await;
            }
            Ok(CallToolResult::text("three steps done"))
        },
    ));

    registry.add_tool(Tool::without_arguments(
        "chatty",
        "Logs at debug, info and error",
        |ctx| async move {
            ctx.log(LogLevel::Debug, "tests", json!("debug detail"))
                .await;
            ctx.log(LogLevel::Info, "tests", json!("info message"))
                .await;
            ctx.log(LogLevel::Error, "tests", json!("error message"))
                .await;
            Ok(CallToolResult::text("logged"))
        },
    ));

    let gate_probes = probes.clone();
    registry.add_tool(
        Tool::without_arguments(
            "asks_when_let_go",
            "Asks the user's name once the test lets it (Probes::ask_gate), and records the answer",
            move |ctx| {
                let probes = gate_probes.clone();
                async move {
                    probes.ask_waiting.store(true, Ordering::SeqCst);
                    probes.ask_gate.notified().await;
                    let answer = ctx
                        .elicit("user_name", "What is your name?", text_form("name"))
                        .await?;
                    let told = format!("{answer:?}");
                    *probes
                        .late_answer
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(told.clone());
                    Ok(CallToolResult::text(told))
                }
            },
        )
        .hidden(),
    );

    let slow_probes = probes.clone();
    registry.add_tool(Tool::without_arguments(
        "slow_progress",
        "Reports progress, then works for a minute",
        move |ctx| {
            let probes = slow_probes.clone();
            async move {
                let _probe = DropProbe(probes.clone());
                probes.slow_started.store(true, Ordering::SeqCst);
                ctx.progress(1.0, Some(100.0), Some("started")).await;
                tokio::time::sleep(Duration::from_secs(60)).await;
                probes.slow_finished.store(true, Ordering::SeqCst);
                Ok(CallToolResult::text("slow done"))
            }
        },
    ));

    registry.add_tool(Tool::without_arguments(
        "needs_sampling",
        "Cannot work without the sampling capability",
        |ctx| async move {
            ctx.require("sampling")?;
            Ok(CallToolResult::text("sampling available"))
        },
    ));

    registry.add_tool(
        Tool::without_arguments(
            "confirm_then_sample",
            "Asks the user to go on, then cannot go on without the sampling capability",
            |ctx| async move {
                ctx.elicit("go_on", "Go on?", text_form("answer")).await?;
                ctx.require("sampling")?;
                Ok(CallToolResult::text("went on, with a model at hand"))
            },
        )
        .hidden(),
    );

    registry.add_tool(Tool::without_arguments(
        "ask_model",
        "Asks the client's model for a one-line verdict; says why when there is none",
        |ctx| async move {
            let question = SamplingParams::user_text("Give a one-line verdict on Casablanca.", 50);
            Ok(CallToolResult::text(
                match ctx.sample("verdict", question).await? {
                    Sampling::Reply(reply) => format!("model said: {}", reply.text),
                    Sampling::Unsupported => "no model: sampling not declared".to_owned(),
                    Sampling::Failed(why) => format!("no model: {why}"),
                },
            ))
        },
    ));

    registry.add_tool(Tool::with_raw_schema(
        "regional",
        "Echoes its region, which is mirrored in the Mcp-Param-Region header",
        json!({
            "type": "object",
            "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"},
                "seats": {"type": "integer", "x-mcp-header": "Seats"}
            },
            "required": ["region"]
        }),
        |_, args| async move {
            let region = args
                .get("region")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let seats = args.get("seats").map(|seats| format!(", seats: {seats}"));
            Ok(CallToolResult::text(format!(
                "Region: {region}{}",
                seats.unwrap_or_default()
            )))
        },
    ));

    registry.add_tool(Tool::without_arguments(
        "open_link",
        "Asks the user to open a page (URL-mode elicitation, key open_page) and says what they did",
        |ctx| async move {
            let open_page = InputRequest::Elicit(ElicitParams::Url {
                message: "Connect your catalogue account".into(),
                url: "https://catalogue.example/connect?session=7".into(),
            });
            let answers = ctx.ask(vec![("open_page".into(), open_page)]).await?;
            let outcome = match answers.elicitation("open_page") {
                Some(Elicitation::Accepted(_)) => "opened",
                Some(Elicitation::Declined) => "declined",
                Some(Elicitation::Cancelled) => "cancelled",
                Some(Elicitation::Unsupported) | None => "not asked",
            };
            Ok(CallToolResult::text(outcome))
        },
    ));

    registry.add_tool(
        Tool::without_arguments(
            "nested_form",
            "Fails with a bug: asks with a form nested in a form (key address), which no client may be sent",
            |ctx| async move {
                let nested = json!({"type": "object", "properties": {"address": {
                    "type": "object", "properties": {"city": {"type": "string"}}}}});
                let answer = ctx.elicit("address", "Where do you live?", nested).await?;
                Ok(CallToolResult::text(format!("answered {answer:?}")))
            },
        )
        .hidden(),
    );

    registry.add_tool(
        Tool::without_arguments(
            "only_as_a_task",
            "Work that can only run as a task (the test server keeps none)",
            |ctx| async move {
                ctx.require_task()?;
                Ok(CallToolResult::text("ran as a task"))
            },
        )
        .hidden(),
    );

    registry.add_tool(
        Tool::without_arguments("panics", "Fails with a bug: it panics", |_| async {
            panic!("a bug in a tool");
        })
        .hidden(),
    );

    let tools_changed = events.clone();
    registry.add_tool(
        Tool::without_arguments(
            "trigger_tools_changed",
            "Announces a change of the tool list",
            move |_| {
                let events = tools_changed.clone();
                async move {
                    events.notify(ServerEvent::ToolsListChanged);
                    Ok(CallToolResult::text("tools changed"))
                }
            },
        )
        .hidden(),
    );

    let flood = events.clone();
    registry.add_tool(
        Tool::without_arguments(
            "flood_of_changes",
            "Announces more prompt-list changes than a stream not reading can hold, with one \
             update of test://static-text among them",
            move |_| {
                let events = flood.clone();
                async move {
                    for round in 0..2 * FLOOD_HALF {
                        if round == FLOOD_HALF {
                            events
                                .notify(ServerEvent::ResourceUpdated("test://static-text".into()));
                        }
                        events.notify(ServerEvent::PromptsListChanged);
                    }
                    Ok(CallToolResult::text("flooded"))
                }
            },
        )
        .hidden(),
    );

    let prompts_changed = events.clone();
    registry.add_tool(
        Tool::without_arguments(
            "trigger_prompts_changed",
            "Announces a change of the prompt list",
            move |_| {
                let events = prompts_changed.clone();
                async move {
                    events.notify(ServerEvent::PromptsListChanged);
                    Ok(CallToolResult::text("prompts changed"))
                }
            },
        )
        .hidden(),
    );

    registry.add_prompt(Prompt::new(
        "simple_prompt",
        "A prompt without arguments",
        |_, _| async {
            Ok(GetPromptResult {
                description: None,
                messages: vec![PromptMessage::user(Content::text("A simple prompt."))],
            })
        },
    ));

    registry.add_prompt(
        Prompt::new(
            "greeting",
            "Greets someone by name",
            |_, arguments| async move {
                let name = arguments.get("name").and_then(Value::as_str);
                Ok(GetPromptResult {
                    description: None,
                    messages: vec![PromptMessage::user(Content::text(format!(
                        "Hello, {}.",
                        name.unwrap_or("nobody")
                    )))],
                })
            },
        )
        .argument(PromptArgument::required("name", "Who to greet"))
        .argument(PromptArgument::optional("tone", "How warmly")),
    );

    registry.add_resource(
        Resource::new("test://static-text", "static-text", |_, uri| async move {
            Ok(ReadResourceResult {
                contents: vec![ResourceContents::text(uri, "text/plain", "Static text.")],
            })
        })
        .mime_type("text/plain"),
    );

    registry.add_template(ResourceTemplate::new(
        "test://items/{id}",
        "item",
        |_, uri, vars| async move {
            let id = vars
                .iter()
                .find(|(name, _)| name == "id")
                .map(|(_, value)| value.clone())
                .unwrap_or_default();
            Ok(ReadResourceResult {
                contents: vec![ResourceContents::text(
                    uri,
                    "text/plain",
                    format!("Item {id}"),
                )],
            })
        },
    ));

    registry
}
