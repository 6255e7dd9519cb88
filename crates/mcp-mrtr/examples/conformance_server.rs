//! The conformance suite's fixture server, written on this crate the way any author would use it:
//! the tools, prompts and resources `@modelcontextprotocol/conformance` calls, with their expected
//! behaviour. Run it with `cargo run --example conformance_server -- --bind 127.0.0.1:3000`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use mcp_mrtr::auth::AnonymousOnly;
use mcp_mrtr::mrtr::RequestContext;
use mcp_mrtr::protocol::content::{
    CallToolResult, Content, GetPromptResult, PromptMessage, ReadResourceResult, ResourceContents,
};
use mcp_mrtr::protocol::input::{
    Elicitation, EmptyParams, InputRequest, Roots, Sampling, SamplingParams,
};
use mcp_mrtr::protocol::{LogLevel, ProtocolError};
use mcp_mrtr::registry::{Prompt, PromptArgument, Registry, Resource, ResourceTemplate, Tool};
use mcp_mrtr::server::{Events, ServerEvent, ServerInfo};
use mcp_mrtr::service::{self, Settings};
use mcp_mrtr::store::RedisStoreConfig;
use mcp_mrtr::tasks::TaskSettings;
use serde::Deserialize;
use serde_json::{Value, json};

const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
const WAV: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";

/// The conformance fixture server.
#[derive(Debug, Parser)]
struct Cli {
    /// Address to listen on; the MCP endpoint is /mcp.
    #[arg(long, default_value = "127.0.0.1:3000")]
    bind: SocketAddr,

    /// requestState sealing keys, `id:base64-32-bytes[,id:key…]`, the same on every replica; a
    /// development key when unset.
    #[arg(long, env = "MCP_STATE_KEYS", hide_env_values = true)]
    state_keys: Option<String>,

    /// Redis shared by replicas (continuations, sessions, events); in memory when unset.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    redis_url: Option<String>,

    /// Prefix of every Redis key this server writes.
    #[arg(long, default_value = "mcp-conformance:")]
    redis_prefix: String,

    /// Most tasks run at once (four times as many are held, running or waiting).
    #[arg(long, default_value_t = TaskSettings::default().max_running as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    task_max_running: u64,

    /// Most continuations, and apart legacy sessions and tasks, one caller holds at once.
    #[arg(long, default_value_t = Settings::default().share_per_owner,
          value_parser = clap::value_parser!(u64).range(1..))]
    share_per_caller: u64,
}

impl Cli {
    fn settings(&self) -> Settings {
        Settings {
            state_keys: self.state_keys.clone(),
            redis: self.redis_url.clone().map(|url| RedisStoreConfig {
                url,
                prefix: self.redis_prefix.clone(),
                timeout: Duration::from_secs(1),
                cluster: false,
            }),
            loopback: self.bind.ip().is_loopback(),
            tasks: TaskSettings {
                max_running: usize::try_from(self.task_max_running).unwrap_or(usize::MAX),
                ..TaskSettings::default()
            },
            share_per_owner: self.share_per_caller,
            ..Settings::default()
        }
    }
}

/// The allocator a server binary built on this crate would pick for speed (the crate itself
/// leaves the choice to the binary).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let events = Events::new();
    let mut registry = Registry::new();
    content_tools(&mut registry);
    interaction_tools(&mut registry);
    input_required_tools(&mut registry);
    stateless_tools(&mut registry, &events);
    task_tools(&mut registry);
    prompts(&mut registry);
    resources(&mut registry);
    let info = ServerInfo {
        name: "mcp-mrtr-conformance".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        instructions: None,
    };
    let settings = cli.settings();
    let router =
        service::router(&settings, registry, info, events, Arc::new(AnonymousOnly)).await?;
    service::serve(cli.bind, &settings, router, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}

/// Tools that return each kind of content, progress and log messages.
fn content_tools(registry: &mut Registry) {
    registry
        .add_tool(Tool::without_arguments(
            "test_simple_text",
            "Returns a simple text response",
            |_| async {
                Ok(CallToolResult::text(
                    "This is a simple text response for testing.",
                ))
            },
        ))
        .add_tool(Tool::without_arguments(
            "test_image_content",
            "Returns an image",
            |_| async {
                Ok(CallToolResult::content(vec![Content::image(
                    PNG,
                    "image/png",
                )]))
            },
        ))
        .add_tool(Tool::without_arguments(
            "test_audio_content",
            "Returns audio",
            |_| async {
                Ok(CallToolResult::content(vec![Content::audio(
                    WAV,
                    "audio/wav",
                )]))
            },
        ))
        .add_tool(Tool::without_arguments(
            "test_embedded_resource",
            "Returns an embedded resource",
            |_| async {
                Ok(CallToolResult::content(vec![Content::resource(
                    ResourceContents::text(
                        "test://embedded-resource",
                        "text/plain",
                        "This is an embedded resource content.",
                    ),
                )]))
            },
        ))
        .add_tool(Tool::without_arguments(
            "test_multiple_content_types",
            "Returns text, an image and a resource",
            |_| async {
                Ok(CallToolResult::content(vec![
                    Content::text("Multiple content types test:"),
                    Content::image(PNG, "image/png"),
                    Content::resource(ResourceContents::text(
                        "test://mixed-content-resource",
                        "application/json",
                        r#"{"test":"data","value":123}"#,
                    )),
                ]))
            },
        ))
        .add_tool(Tool::without_arguments(
            "test_tool_with_logging",
            "Sends three log messages while it runs",
            |ctx| async move {
                for (i, message) in [
                    "Tool execution started",
                    "Tool processing data",
                    "Tool execution completed",
                ]
                .iter()
                .enumerate()
                {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    ctx.log(LogLevel::Info, "conformance", json!(message)).await;
                }
                Ok(CallToolResult::text(
                    "Tool with logging executed successfully",
                ))
            },
        ))
        .add_tool(Tool::without_arguments(
            "test_tool_with_progress",
            "Reports progress 0, 50 and 100 of 100",
            |ctx| async move {
                for (i, step) in [0.0, 50.0, 100.0].into_iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    ctx.progress(
                        step,
                        Some(100.0),
                        Some(&format!("Completed step {}", i + 1)),
                    )
                    .await;
                }
                let token = ctx.meta().progress_token.clone().unwrap_or(Value::Null);
                Ok(CallToolResult::text(match token {
                    Value::String(token) => token,
                    other => other.to_string(),
                }))
            },
        ))
        .add_tool(Tool::without_arguments(
            "test_error_handling",
            "Always fails with a tool error",
            |_| async {
                Ok(CallToolResult::error(
                    "This tool intentionally returns an error for testing",
                ))
            },
        ))
        .add_tool(Tool::without_arguments(
            "test_reconnection",
            "Returns after a short pause",
            |_| async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok(CallToolResult::text("Reconnection test completed"))
            },
        ));
}

#[derive(Deserialize, schemars::JsonSchema)]
struct PromptArgs {
    /// The prompt to send to the client's model.
    prompt: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct MessageArgs {
    /// The message to show the user.
    message: String,
}

/// Tools that ask the client for sampling or a form.
fn interaction_tools(registry: &mut Registry) {
    registry
        .add_tool(Tool::new("test_sampling", "Asks the client's model to answer a prompt", |ctx, args: PromptArgs| async move {
            ctx.require("sampling")?;
            match ctx.sample("sampling", SamplingParams::user_text(args.prompt, 100)).await? {
                Sampling::Reply(reply) => Ok(CallToolResult::text(format!("LLM response: {}", reply.text))),
                Sampling::Unsupported => Ok(CallToolResult::error("The client does not support sampling")),
                Sampling::Failed(why) => Ok(CallToolResult::error(format!("Sampling failed: {why}"))),
            }
        }))
        .add_tool(Tool::new("test_elicitation", "Asks the user for a response", |ctx, args: MessageArgs| async move {
            let schema = json!({
                "type": "object",
                "properties": {"response": {"type": "string", "description": "User's response"}},
                "required": ["response"]
            });
            let answer = ctx.elicit("response", &args.message, schema).await?;
            Ok(CallToolResult::text(describe(&answer)))
        }))
        .add_tool(Tool::without_arguments("test_elicitation_sep1034_defaults", "Asks for a form whose fields have defaults", |ctx| async move {
            let schema = json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "User name", "default": "John Doe"},
                    "age": {"type": "integer", "description": "User age", "default": 30},
                    "score": {"type": "number", "description": "User score", "default": 95.5},
                    "status": {"type": "string", "description": "User status", "enum": ["active", "inactive", "pending"], "default": "active"},
                    "verified": {"type": "boolean", "description": "Verification status", "default": true}
                }
            });
            let answer = ctx.elicit("defaults", "Please review and update the form fields with defaults", schema).await?;
            Ok(CallToolResult::text(format!("Elicitation completed: {}", describe(&answer))))
        }))
        .add_tool(Tool::without_arguments("test_elicitation_sep1330_enums", "Asks for a form with every enum style", |ctx| async move {
            // The values the scenario describes, which its client answers with.
            let options = ["option1", "option2", "option3"];
            let titled_single = json!([{"const": "value1", "title": "First Option"}, {"const": "value2", "title": "Second Option"}, {"const": "value3", "title": "Third Option"}]);
            let titled_multi = json!([{"const": "value1", "title": "First Choice"}, {"const": "value2", "title": "Second Choice"}, {"const": "value3", "title": "Third Choice"}]);
            let schema = json!({
                "type": "object",
                "properties": {
                    "untitledSingle": {"type": "string", "description": "Untitled single-select", "enum": options},
                    "titledSingle": {"type": "string", "description": "Titled single-select", "oneOf": titled_single},
                    "legacyEnum": {"type": "string", "description": "Legacy titled enum", "enum": ["opt1", "opt2", "opt3"], "enumNames": ["Option One", "Option Two", "Option Three"]},
                    "untitledMulti": {"type": "array", "description": "Untitled multi-select", "minItems": 1, "maxItems": 3, "items": {"type": "string", "enum": options}},
                    "titledMulti": {"type": "array", "description": "Titled multi-select", "minItems": 1, "maxItems": 3, "items": {"anyOf": titled_multi}}
                }
            });
            let answer = ctx.elicit("enums", "Please select options from the enum fields", schema).await?;
            Ok(CallToolResult::text(format!("Elicitation completed: {}", describe(&answer))))
        }))
        .add_tool(Tool::with_raw_schema(
            "json_schema_2020_12_tool",
            "Echoes its arguments; its input schema uses JSON Schema 2020-12 keywords",
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {"address": {"$anchor": "addressDef", "type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
                "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
                "additionalProperties": false,
                "allOf": [{"anyOf": [{"required": ["name"]}, {"required": ["address"]}]}],
                "if": {"properties": {"name": {"const": "test"}}},
                "then": {"properties": {"address": {"required": ["city"]}}},
                "else": {}
            }),
            |_, args| async move { Ok(CallToolResult::text(format!("Received: {args}"))) },
        ));
}

fn describe(answer: &Elicitation) -> String {
    match answer {
        Elicitation::Accepted(content) => format!(
            "User response: action=accept, content={}",
            Value::Object(content.clone())
        ),
        Elicitation::Declined => "User response: action=decline".into(),
        Elicitation::Cancelled => "User response: action=cancel".into(),
        Elicitation::Unsupported => "The client does not support elicitation".into(),
    }
}

fn name_form() -> Value {
    json!({"type": "object", "properties": {"name": {"type": "string", "description": "Your name"}}, "required": ["name"]})
}

fn confirm_form() -> Value {
    json!({"type": "object", "properties": {"ok": {"type": "boolean", "description": "Confirm"}}, "required": ["ok"]})
}

#[derive(Deserialize, schemars::JsonSchema)]
struct GreetArgs {
    /// Who to greet.
    name: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct ComputeArgs {
    /// How long the computation takes, in seconds.
    seconds: u64,
    /// A label echoed in the result.
    #[serde(default)]
    label: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct FileArgs {
    /// The file to delete.
    filename: String,
}

/// The tools of the Tasks extension scenarios (SEP-2663).
fn task_tools(registry: &mut Registry) {
    registry
        .add_tool(Tool::new("greet", "Greets someone at once", |_, args: GreetArgs| async move {
            Ok(CallToolResult::text(format!("Hello, {}!", args.name)))
        }))
        .add_tool(Tool::new("slow_compute", "Computes for the given number of seconds; a task when the client takes tasks", |ctx, args: ComputeArgs| async move {
            if args.seconds > 0 {
                ctx.continue_as_task()?;
            }
            tokio::time::sleep(Duration::from_secs(args.seconds)).await;
            Ok(CallToolResult::text(format!("Computed {} in {}s", args.label, args.seconds)))
        }))
        .add_tool(Tool::without_arguments("failing_job", "Runs only as a task, and ends with a tool error after a second", |ctx| async move {
            ctx.require_task()?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(CallToolResult::error("The job failed: the input could not be processed"))
        }))
        .add_tool(Tool::without_arguments("protocol_error_job", "A task that ends with a JSON-RPC error", |ctx| async move {
            ctx.continue_as_task()?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            Err(ProtocolError::internal("The job's backend refused the request").into())
        }))
        .add_tool(Tool::new("confirm_delete", "A task that asks for confirmation before deleting a file", |ctx, args: FileArgs| async move {
            ctx.continue_as_task()?;
            let form = json!({"type": "object", "properties": {"confirm": {"type": "boolean", "description": "Delete it?"}}, "required": ["confirm"]});
            let message = format!("Delete {}?", args.filename);
            let confirmed = match ctx.elicit("confirm_delete", &message, form).await? {
                Elicitation::Accepted(content) => content.get("confirm").and_then(Value::as_bool).unwrap_or(false),
                _ => false,
            };
            let outcome = if confirmed { "Deleted" } else { "Kept" };
            Ok(CallToolResult::text(format!("{outcome} {}", args.filename)))
        }))
        .add_tool(Tool::without_arguments("multi_input", "A task that asks two questions at once", |ctx| async move {
            ctx.continue_as_task()?;
            let answers = ctx
                .ask(vec![
                    ("first_name".into(), elicit_request("Your first name?", name_form())),
                    ("last_name".into(), elicit_request("Your last name?", name_form())),
                ])
                .await?;
            let name = |key: &str| answers.elicitation(key).and_then(|a| a.text("name")).unwrap_or_else(|| "?".into());
            Ok(CallToolResult::text(format!("Hello, {} {}!", name("first_name"), name("last_name"))))
        }))
        .add_tool(Tool::without_arguments("test_tool_with_task", "Asks the user's name, then continues as a task", |ctx| async move {
            let answer = ctx.elicit("user_name", "What is your name?", name_form()).await?;
            let name = answer.text("name").unwrap_or_else(|| "stranger".into());
            ctx.require_task()?;
            Ok(CallToolResult::text(format!("Hello, {name}! Your task is done.")))
        }));
}

/// The MRTR tools of SEP-2322.
fn input_required_tools(registry: &mut Registry) {
    registry
        .add_tool(Tool::without_arguments("test_input_required_result_elicitation", "MRTR: asks the user's name", |ctx| async move {
            let answer = ctx.elicit("user_name", "What is your name?", name_form()).await?;
            let name = answer.text("name").unwrap_or_else(|| "stranger".into());
            Ok(CallToolResult::text(format!("Hello, {name}!")))
        }))
        .add_tool(Tool::without_arguments("test_input_required_result_sampling", "MRTR: asks the client's model a question", |ctx| async move {
            let params = SamplingParams::user_text("What is the capital of France?", 100);
            Ok(CallToolResult::text(match ctx.sample("sample_request", params).await? {
                Sampling::Reply(reply) => format!("Sampling response: {}", reply.text),
                Sampling::Unsupported => "The client does not support sampling".into(),
                Sampling::Failed(why) => format!("Sampling failed: {why}"),
            }))
        }))
        .add_tool(Tool::without_arguments("test_input_required_result_list_roots", "MRTR: asks for the client's roots", |ctx| async move {
            Ok(CallToolResult::text(match ctx.list_roots("roots_request").await? {
                Roots::Listed(roots) => format!("Found {} root(s)", roots.len()),
                Roots::Unsupported => "The client does not support roots".into(),
                Roots::Failed(why) => format!("Listing roots failed: {why}"),
            }))
        }))
        .add_tool(Tool::without_arguments("test_input_required_result_request_state", "MRTR: asks for confirmation and keeps state", |ctx| async move {
            let answer = ctx.elicit("confirm", "Please confirm", confirm_form()).await?;
            Ok(CallToolResult::text(format!("state-ok: confirmed={}", answer.text("ok").unwrap_or_else(|| "false".into()))))
        }))
        .add_tool(Tool::without_arguments("test_input_required_result_multiple_inputs", "MRTR: asks three questions in one round", |ctx| async move {
            let answers = ctx
                .ask(vec![
                    ("user_name".into(), elicit_request("What is your name?", name_form())),
                    ("greeting".into(), InputRequest::Sample(SamplingParams::user_text("Say hello", 50))),
                    ("client_roots".into(), InputRequest::ListRoots(EmptyParams {})),
                ])
                .await?;
            let name = answers.elicitation("user_name").and_then(|a| a.text("name")).unwrap_or_default();
            let greeting = match answers.sampling("greeting") {
                Some(Sampling::Reply(reply)) => reply.text.clone(),
                _ => String::new(),
            };
            let roots = match answers.roots("client_roots") {
                Some(Roots::Listed(roots)) => roots.len(),
                _ => 0,
            };
            Ok(CallToolResult::text(format!("name={name}; greeting={greeting}; roots={roots}")))
        }))
        .add_tool(Tool::without_arguments("test_input_required_result_multi_round", "MRTR: asks two questions in two rounds", |ctx| async move {
            let first = ctx.elicit("step1", "Step 1: What is your name?", name_form()).await?;
            let name = first.text("name").unwrap_or_default();
            let color_form = json!({"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]});
            let second = ctx.elicit("step2", "Step 2: What is your favorite color?", color_form).await?;
            let color = second.text("color").unwrap_or_default();
            Ok(CallToolResult::text(format!("{name} likes {color}")))
        }))
        .add_tool(Tool::without_arguments("test_input_required_result_tampered_state", "MRTR: asks for confirmation; refuses altered state", |ctx| async move {
            let answer = ctx.elicit("confirm", "Please confirm", confirm_form()).await?;
            Ok(CallToolResult::text(format!("confirmed={}", answer.text("ok").unwrap_or_else(|| "false".into()))))
        }))
        .add_tool(Tool::without_arguments("test_input_required_result_capabilities", "MRTR: asks only what the client declared", |ctx| async move {
            let answers = ctx
                .ask(vec![
                    ("sample_input".into(), InputRequest::Sample(SamplingParams::user_text("Sample request", 50))),
                    ("user_input".into(), elicit_request("Elicit request", name_form())),
                    ("client_roots".into(), InputRequest::ListRoots(EmptyParams {})),
                ])
                .await?;
            let mut got = Vec::new();
            if let Some(Sampling::Reply(_)) = answers.sampling("sample_input") {
                got.push("sampling");
            }
            if let Some(Elicitation::Accepted(_)) = answers.elicitation("user_input") {
                got.push("elicitation");
            }
            if let Some(Roots::Listed(_)) = answers.roots("client_roots") {
                got.push("roots");
            }
            Ok(CallToolResult::text(if got.is_empty() {
                "No supported capabilities declared".to_owned()
            } else {
                format!("Answered: {}", got.join(", "))
            }))
        }));
}

fn elicit_request(message: &str, schema: Value) -> InputRequest {
    InputRequest::Elicit(mcp_mrtr::protocol::input::ElicitParams::Form {
        message: message.into(),
        requested_schema: schema,
    })
}

/// Tools for the stateless-wire probes, including the hidden change triggers.
fn stateless_tools(registry: &mut Registry, events: &Events) {
    let tools_changed = events.clone();
    let prompts_changed = events.clone();
    registry
        .add_tool(Tool::without_arguments(
            "test_missing_capability",
            "Needs the sampling capability",
            |ctx| async move {
                ctx.require("sampling")?;
                Ok(CallToolResult::text("Success"))
            },
        ))
        .add_tool(Tool::without_arguments(
            "test_streaming_elicitation",
            "Streams a progress notification, then its result",
            |ctx| async move {
                ctx.progress(1.0, Some(1.0), Some("Streaming")).await;
                Ok(CallToolResult::text("Streaming complete"))
            },
        ))
        .add_tool(Tool::with_raw_schema(
            "test_custom_header",
            "Echoes a parameter that clients mirror into the Mcp-Param-TestHeader header",
            json!({
                "type": "object",
                "properties": {"value": {"type": "string", "description": "Echoed back", "x-mcp-header": "TestHeader"}},
                "required": ["value"]
            }),
            |_, args| async move { Ok(CallToolResult::text(format!("Header value: {}", args["value"]))) },
        ))
        .add_tool(Tool::without_arguments(
            "test_logging_tool",
            "Logs only when the request asks for a log level",
            |ctx| async move {
                ctx.log(LogLevel::Info, "conformance", json!("Logging tool invoked"))
                    .await;
                Ok(CallToolResult::text("Logging evaluated"))
            },
        ))
        .add_tool(
            Tool::without_arguments(
                "test_trigger_tool_change",
                "Announces a change of the tool list",
                move |_| {
                    let events = tools_changed.clone();
                    async move {
                        events.notify(ServerEvent::ToolsListChanged);
                        Ok(CallToolResult::text("Mutation triggered"))
                    }
                },
            )
            .hidden(),
        )
        .add_tool(
            Tool::without_arguments(
                "test_trigger_prompt_change",
                "Announces a change of the prompt list",
                move |_| {
                    let events = prompts_changed.clone();
                    async move {
                        events.notify(ServerEvent::PromptsListChanged);
                        Ok(CallToolResult::text("Mutation triggered"))
                    }
                },
            )
            .hidden(),
        );
}

fn prompts(registry: &mut Registry) {
    let text = |message: &str| GetPromptResult {
        description: None,
        messages: vec![PromptMessage::user(Content::text(message))],
    };
    registry
        .add_prompt(
            Prompt::new("test_simple_prompt", "A simple prompt without arguments", move |_, _| async move {
                Ok(text("This is a simple prompt for testing."))
            })
            .title("Simple Test Prompt"),
        )
        .add_prompt(
            Prompt::new("test_prompt_with_arguments", "A prompt with two required arguments", move |_, args| async move {
                let arg = |name: &str| args.get(name).and_then(Value::as_str).unwrap_or_default().to_owned();
                Ok(text(&format!("Prompt with arguments: arg1='{}', arg2='{}'", arg("arg1"), arg("arg2"))))
            })
            .argument(PromptArgument::required("arg1", "First test argument"))
            .argument(PromptArgument::required("arg2", "Second test argument")),
        )
        .add_prompt(
            Prompt::new("test_prompt_with_embedded_resource", "A prompt that embeds a resource", |_, args| async move {
                let uri = args.get("resourceUri").and_then(Value::as_str).unwrap_or("test://example-resource").to_owned();
                Ok(GetPromptResult {
                    description: None,
                    messages: vec![
                        PromptMessage::user(Content::resource(ResourceContents::text(uri, "text/plain", "Embedded resource content for testing."))),
                        PromptMessage::user(Content::text("Please process the embedded resource above.")),
                    ],
                })
            })
            .argument(PromptArgument::required("resourceUri", "URI of the resource to embed")),
        )
        .add_prompt(Prompt::new("test_prompt_with_image", "A prompt that includes an image", |_, _| async {
            Ok(GetPromptResult {
                description: None,
                messages: vec![
                    PromptMessage::user(Content::image(PNG, "image/png")),
                    PromptMessage::user(Content::text("Please analyze the image above.")),
                ],
            })
        }))
        .add_prompt(Prompt::new(
            "test_input_required_result_prompt",
            "MRTR: prompt that requires elicitation input",
            move |ctx, _| async move {
                let form = json!({"type": "object", "properties": {"context": {"type": "string"}}, "required": ["context"]});
                let answer = ctx.elicit("user_context", "What context should the prompt use?", form).await?;
                let context = answer.text("context").unwrap_or_default();
                Ok(text(&format!("Prompt with context: {context}")))
            },
        ));
}

fn resources(registry: &mut Registry) {
    let fixed = |contents: ResourceContents| {
        move |_: RequestContext, _: String| {
            let contents = contents.clone();
            async move {
                Ok(ReadResourceResult {
                    contents: vec![contents],
                })
            }
        }
    };
    registry
        .add_resource(
            Resource::new(
                "test://static-text",
                "static-text",
                fixed(ResourceContents::text("test://static-text", "text/plain", "This is the content of the static text resource.")),
            )
            .description("A static text resource")
            .mime_type("text/plain"),
        )
        .add_resource(
            Resource::new("test://static-binary", "static-binary", fixed(ResourceContents::blob("test://static-binary", "image/png", PNG)))
                .description("A static binary resource")
                .mime_type("image/png"),
        )
        .add_resource(
            Resource::new(
                "test://watched-resource",
                "watched-resource",
                fixed(ResourceContents::text("test://watched-resource", "text/plain", "Watched resource content")),
            )
            .description("A resource clients can subscribe to")
            .mime_type("text/plain"),
        )
        .add_resource(
            Resource::new(
                "test://stateless-static-text",
                "Stateless Static Text",
                fixed(ResourceContents::text(
                    "test://stateless-static-text",
                    "text/plain",
                    "Static text content from the stateless draft path.",
                )),
            )
            .mime_type("text/plain"),
        )
        .add_template(
            ResourceTemplate::new("test://template/{id}/data", "template", |_, uri, vars| async move {
                let id = vars.iter().find(|(name, _)| name == "id").map(|(_, v)| v.clone()).unwrap_or_default();
                let body = json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")});
                Ok(ReadResourceResult { contents: vec![ResourceContents::text(uri, "application/json", body.to_string())] })
            })
            .description("A resource template with one parameter")
            .mime_type("application/json"),
        );
}
