//! A chat endpoint in an axum service, with kvgate in front of the engine: the integration a Rust
//! developer writes in a handler. The kvgate lines are marked `// kvgate`: 13 of them.
//!
//! ```text
//! cargo run --example axum_handler
//! curl -N localhost:3000/v1/chat/completions -H 'x-user: alice' -d '{"stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}'
//! ```
//!
//! The engine here is a stand-in that streams a few SSE chunks; a real service forwards
//! `chat.into_forward_body()` to vLLM or llama.cpp and returns its streamed answer the same way.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use kvgate::Admission; // kvgate
use kvgate::http::{PermitBody, insert_rate_limit_headers, rejection_response}; // kvgate
use kvgate::openai::{Endpoint, OutputTokens, Parser}; // kvgate
use std::convert::Infallible;
use std::time::Duration;

#[derive(Clone)]
struct App {
    admission: Admission,
    parser: Parser,
}

async fn chat(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    let chat = match app.parser.parse(Endpoint::Chat, body) {
        // kvgate
        Ok(chat) => chat,
        Err(err) => return err.to_response().map(Body::from), // kvgate
    };
    let user = headers.get("x-user").and_then(|v| v.to_str().ok()).unwrap_or("anonymous");
    let request = chat.request().tenant(user); // kvgate
    let mut response = match app.admission.admit(&request).await {
        // kvgate
        Ok(permit) => {
            let answer = engine(chat.into_forward_body()).await; // kvgate: the body to forward
            answer.map(|body| Body::new(PermitBody::new(body, permit).count_with(OutputTokens::new()))) // kvgate
        }
        Err(rejection) => rejection_response(&rejection, &app.admission, false).map(Body::from), // kvgate
    };
    insert_rate_limit_headers(response.headers_mut(), &app.admission.rate_status(request.tenant)); // kvgate
    response
}

/// The stand-in engine: a short SSE answer, a token every 50 ms.
async fn engine(_forwarded: Bytes) -> Response {
    let tokens = ["Hello", " from", " the", " engine"];
    let chunks = futures::stream::iter(tokens).then(|token| async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok::<_, Infallible>(format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{token}\"}}}}]}}\n\n"))
    });
    let done = futures::stream::once(async { Ok::<_, Infallible>("data: [DONE]\n\n".to_owned()) });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(futures::StreamExt::chain(chunks, done)))
        .expect("a valid response")
}

use futures::StreamExt as _;

#[tokio::main]
async fn main() {
    let admission = Admission::builder() // kvgate
        .max_in_flight(32)
        .kv_capacity_tokens(200_000)
        .request_rate(50.0, 100)
        .build()
        .expect("valid limits");
    let app = App { admission, parser: Parser::new() }; // kvgate
    let router = Router::new().route("/v1/chat/completions", post(chat)).with_state(app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await.expect("port 3000 is free");
    println!("listening on http://127.0.0.1:3000/v1/chat/completions");
    axum::serve(listener, router).await.expect("the server runs");
}
