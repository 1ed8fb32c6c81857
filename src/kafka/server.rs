//! Accepting connections and moving frames between the socket and the dispatcher.

use std::rc::Rc;

use bytes::BytesMut;
use futures::future::LocalBoxFuture;
use futures::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::{TcpListener, TcpStream};
use glommio::sync::StaticPermit;

use crate::kafka::dispatch::{self, Reply, Response};
use crate::kafka::frame;
use crate::shard::{Shard, REQUEST_MEMORY_BYTES};

/// Requests per connection between being read and their response being written.
pub const IN_FLIGHT_MAX: usize = 32;

/// Serves the Kafka protocol on this shard's SO_REUSEPORT listener until the process exits.
pub async fn serve(shard: Rc<Shard>) -> anyhow::Result<()> {
    let listener = TcpListener::bind(shard.config.listen_addr)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", shard.config.listen_addr))?;
    tracing::debug!(shard = shard.id.0, addr = %shard.config.listen_addr, "listening");
    if shard.id.0 == 0 {
        announce_ready(&shard.config);
    }
    loop {
        match listener.accept().await {
            Ok(stream) => {
                let shard = shard.clone();
                glommio::spawn_local(async move {
                    let peer = stream.peer_addr().ok();
                    let client_host = peer.map(|p| format!("/{}", p.ip())).unwrap_or_default();
                    if let Err(e) = connection(shard, stream, client_host).await {
                        tracing::debug!(?peer, error = %e, "connection closed");
                    }
                })
                .detach();
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}

/// The one line a person starting the broker acts on: where clients connect, where the data
/// is, and a command to try it with.
fn announce_ready(config: &crate::config::BrokerConfig) {
    let client = format!("{}:{}", config.advertised_host, config.advertised_port);
    tracing::info!(
        "ferrolog is ready: Kafka clients connect to {client} (listening on {}), data in {}; try `kcat -b {client} -L`",
        config.listen_addr,
        config.log_dir.display(),
    );
}

struct InFlight {
    response: LocalBoxFuture<'static, Reply<Response>>,
    _memory: StaticPermit,
}

async fn connection(
    shard: Rc<Shard>,
    stream: TcpStream,
    client_host: String,
) -> anyhow::Result<()> {
    stream
        .set_nodelay(true)
        .map_err(|e| anyhow::anyhow!("set_nodelay: {e}"))?;
    let (mut reader, mut writer) = stream.split();
    let (tx, rx) = local_channel::new_bounded::<InFlight>(IN_FLIGHT_MAX);
    let writer_task = glommio::spawn_local(async move {
        let mut out = BytesMut::new();
        while let Some(item) = rx.recv().await {
            let response = match item.response.await {
                Reply::Send(r) => r,
                Reply::Nothing => continue,
                Reply::Close => {
                    tracing::debug!("closing the connection after a failed acks=0 produce");
                    // Shut the socket down now; the reader then sees the end of the stream.
                    let _ = writer.close().await;
                    return anyhow::Ok(());
                }
            };
            for piece in frame::encode(response, &mut out)? {
                writer.write_all(&piece).await?;
            }
        }
        anyhow::Ok(())
    });
    let max = shard.config.socket_request_max_bytes;
    let result: anyhow::Result<()> = async {
        loop {
            let mut size_buf = [0u8; 4];
            match reader.read_exact(&mut size_buf).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            let size = i32::from_be_bytes(size_buf);
            if size < 0 || size as usize > max {
                tracing::warn!(
                    size,
                    max,
                    "request frame larger than socket.request.max.bytes; closing connection"
                );
                return Ok(());
            }
            let permit = shard
                .request_memory
                // A frame larger than the whole budget takes all of it rather than waiting forever.
                .acquire_static_permit((size as u64).min(REQUEST_MEMORY_BYTES))
                .await
                .map_err(|_| anyhow::anyhow!("request memory closed"))?;
            let mut frame = vec![0u8; size as usize];
            reader.read_exact(&mut frame).await?;
            let response = match dispatch::start(&shard, frame.into(), &client_host).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::info!(error = %e, "closing connection after an invalid request");
                    return Ok(());
                }
            };
            if tx
                .send(InFlight {
                    response,
                    _memory: permit,
                })
                .await
                .is_err()
            {
                return Ok(());
            }
        }
    }
    .await;
    drop(tx);
    let _ = writer_task.await;
    result
}
