//! `refract pools list|add|remove`: the remote worker pools of a running
//! server, through its admin API.

use anyhow::{anyhow, Result};
use refract_proto::admin::{AddPoolRequest, ListPoolsRequest, RemovePoolRequest};

use crate::cli::PoolsCommand;
use crate::client::connect_admin;

/// Runs one `refract pools` command, printing what it did.
pub async fn run(command: PoolsCommand) -> Result<()> {
    match command {
        PoolsCommand::List(server) => {
            let mut admin = connect_admin(&server.job_endpoint).await?;
            let pools = admin
                .list_pools(ListPoolsRequest {})
                .await
                .map_err(|s| anyhow!("listing worker pools failed: {}", s.message()))?
                .into_inner()
                .pools;
            if pools.is_empty() {
                println!(
                    "no worker pools (add some with `refract pools add` or serve --worker_pool)"
                );
            }
            for p in pools {
                let address = if p.address.is_empty() {
                    "-"
                } else {
                    &p.address
                };
                println!(
                    "{}\t{address}\t{}\tcapacity {}\tworkers {}{}",
                    p.spec,
                    p.state,
                    p.capacity,
                    p.workers,
                    if p.detail.is_empty() {
                        String::new()
                    } else {
                        format!("\t{}", p.detail)
                    }
                );
            }
        }
        PoolsCommand::Add(args) => {
            let mut admin = connect_admin(&args.server.job_endpoint).await?;
            admin
                .add_pool(AddPoolRequest {
                    spec: args.spec.clone(),
                })
                .await
                .map_err(|s| anyhow!("adding worker pool failed: {}", s.message()))?;
            println!("{}: added", args.spec);
        }
        PoolsCommand::Remove(args) => {
            let mut admin = connect_admin(&args.server.job_endpoint).await?;
            admin
                .remove_pool(RemovePoolRequest {
                    spec: args.spec.clone(),
                })
                .await
                .map_err(|s| anyhow!("removing worker pool failed: {}", s.message()))?;
            println!("{}: removed", args.spec);
        }
    }
    Ok(())
}
