//! An HTTP route that must not work on the same order twice at once, across every instance of
//! the service.
//!
//! Run: `cargo xtask example http_handler` or
//! `cargo run -p lock-examples --features http --example http_handler` (the feature builds axum;
//! uses `REDIS_URL` when set, else a private redis-server; `RUST_LOG=debug` shows the engine's
//! events).
//!
//! `POST /orders/{id}/ship` calls `ship`, whose lock is named after the order (`order:{id}`):
//! requests for different orders run side by side, and a request for an order that another
//! request (on this instance or another) is shipping gets `409 Conflict` at once (`wait = "0s"`)
//! instead of shipping it twice. The example serves on 127.0.0.1:0, sends two requests for order
//! 7 and one for order 8 at the same time over plain TCP, prints the answers and exits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use lock_runtime::{LockError, Locker, distributed_lock};
use lock_testing::redis_url_or_private_server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How many times each order was shipped.
#[derive(Default)]
struct Orders(Mutex<HashMap<u64, u32>>);

/// The route's errors, as HTTP answers.
enum ApiError {
    /// Another request holds the order's lock.
    Busy,
    /// Redis unreachable, the lease lost mid-way, and the like: the order's state is unknown.
    Lock(LockError),
}

impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        match e {
            LockError::Busy { .. } => ApiError::Busy,
            e => ApiError::Lock(e),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Busy => (
                StatusCode::CONFLICT,
                "another request is shipping this order; retry later\n",
            )
                .into_response(),
            ApiError::Lock(e) => {
                (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response()
            }
        }
    }
}

/// `POST /orders/{id}/ship`.
async fn ship_handler(
    State(orders): State<Arc<Orders>>,
    Path(id): Path<u64>,
) -> Result<String, ApiError> {
    ship(id, &orders).await
}

/// Ships order `id`, one request at a time per order across every instance (the process
/// default locker, set in `main`). `wait = "0s"`: a second request is answered at once rather
/// than queued to ship the order again.
#[distributed_lock(name = "order:{id}", ttl = "10s", wait = "0s")]
async fn ship(id: u64, orders: &Orders) -> Result<String, ApiError> {
    // A slow step, as a call to the carrier's service would be.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut shipped = orders.0.lock().unwrap();
    let count = shipped.entry(id).or_default();
    *count += 1;
    Ok(format!("order {id} shipped\n"))
}

/// Sends `POST path` over a fresh connection; returns the status (`409 Conflict`) and the body.
async fn post_request(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr)
        .await
        .expect("connect to the server");
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("receive");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status_line = head.lines().next().unwrap_or_default();
    let status = status_line.split_once(' ').map_or("", |(_, s)| s);
    (status.to_owned(), body.trim().to_owned())
}

#[tokio::main]
async fn main() {
    lock_examples::show_lock_events();
    let (url, _server) = redis_url_or_private_server();
    lock_runtime::set_default_locker(Locker::connect(&url).await.expect("connect"))
        .expect("first default");
    let orders = Arc::new(Orders::default());
    let app = Router::new()
        .route("/orders/{id}/ship", post(ship_handler))
        .with_state(Arc::clone(&orders));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    println!("serving on http://{addr}, locks on {url}");

    let (a, b, c) = tokio::join!(
        post_request(addr, "/orders/7/ship"),
        post_request(addr, "/orders/7/ship"),
        post_request(addr, "/orders/8/ship"),
    );
    for (id, (status, body)) in [(7, &a), (7, &b), (8, &c)] {
        println!("POST /orders/{id}/ship -> {status}: {body}");
    }
    let mut same_order = [a.0.as_str(), b.0.as_str()];
    same_order.sort_unstable();
    assert_eq!(
        same_order,
        ["200 OK", "409 Conflict"],
        "one request for order 7 is refused"
    );
    assert_eq!(c.0, "200 OK", "order 8 ships beside order 7");
    let shipped = orders.0.lock().unwrap().clone();
    assert_eq!(shipped.get(&7), Some(&1), "order 7 shipped once");
    println!(
        "order 7 shipped once: one request held `order:7` and the other got 409 Conflict at \
         once; order 8 shipped at the same time under its own lock"
    );
}
