//! The deployment the environment describes: the process default locker and `lockctl` read it.

use super::LockerBuilder;
use crate::LockError;

/// The variables [`LockerBuilder::from_env`] reads, in the order it looks at them.
pub const ENV_VARS: [&str; 6] = [
    "LOCK_REDIS_CLUSTER",
    "LOCK_REDIS_SENTINELS",
    "LOCK_REDIS_SENTINEL_MASTER",
    "LOCK_REDIS_URL",
    "REDIS_URL",
    "LOCK_REDIS_REPLICAS",
];

impl LockerBuilder {
    /// A builder for the deployment the environment describes (the process default locker and
    /// `lockctl` use it):
    ///
    /// - `LOCK_REDIS_CLUSTER=redis://a:7000,redis://b:7001`: a Redis Cluster, from these seeds;
    /// - else `LOCK_REDIS_SENTINELS=redis://s1:26379,redis://s2:26379` with
    ///   `LOCK_REDIS_SENTINEL_MASTER=mymaster`: the primary those Sentinels name;
    /// - else `LOCK_REDIS_URL`, then `REDIS_URL`: one server, or Redlock over several
    ///   comma-separated URLs;
    /// - else `redis://127.0.0.1:6379`;
    /// - and `LOCK_REDIS_REPLICAS=n` for [`replicas(n)`](Self::replicas) on any of them.
    ///
    /// Returns a `Config` error naming the variable when one is malformed or two deployments
    /// are given.
    pub fn from_env() -> Result<Self, LockError> {
        Self::from_vars(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    /// Where [`from_vars`](Self::from_vars) takes the deployment from: the first variable of
    /// its order that is set, or the built-in default.
    pub(crate) fn source_of(var: impl Fn(&str) -> Option<String>) -> &'static str {
        [
            ("LOCK_REDIS_CLUSTER", "LOCK_REDIS_CLUSTER"),
            (
                "LOCK_REDIS_SENTINELS",
                "LOCK_REDIS_SENTINELS and LOCK_REDIS_SENTINEL_MASTER",
            ),
            ("LOCK_REDIS_URL", "LOCK_REDIS_URL"),
            ("REDIS_URL", "REDIS_URL"),
        ]
        .into_iter()
        .find(|(name, _)| var(name).is_some())
        .map_or(
            "the built-in default (no LOCK_REDIS_CLUSTER, LOCK_REDIS_SENTINELS, LOCK_REDIS_URL \
             or REDIS_URL is set)",
            |(_, said)| said,
        )
    }

    /// Where [`from_env`](Self::from_env) takes the deployment from.
    pub(crate) fn env_source() -> &'static str {
        Self::source_of(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    /// [`from_env`](Self::from_env) over any source of variables (tested without touching the
    /// process environment).
    pub(crate) fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, LockError> {
        let list = |v: String| -> Vec<String> {
            v.split(',')
                .map(|u| u.trim().to_owned())
                .filter(|u| !u.is_empty())
                .collect()
        };
        let bad = |name: &str, why: String| {
            LockError::config(
                "",
                format!("{name}: {why}; fix {name} or call set_default_locker"),
            )
        };
        let cluster = var("LOCK_REDIS_CLUSTER");
        let sentinels = var("LOCK_REDIS_SENTINELS");
        let master = var("LOCK_REDIS_SENTINEL_MASTER");
        let mut builder = match (cluster, sentinels) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "LOCK_REDIS_CLUSTER",
                    "both LOCK_REDIS_CLUSTER and LOCK_REDIS_SENTINELS are set; a locker uses one deployment".to_owned(),
                ));
            }
            (Some(seeds), None) => Self::default().cluster(list(seeds)),
            (None, Some(sentinels)) => {
                let Some(master) = master else {
                    return Err(bad(
                        "LOCK_REDIS_SENTINEL_MASTER",
                        "LOCK_REDIS_SENTINELS is set but not the master name to ask them for"
                            .to_owned(),
                    ));
                };
                Self::default().sentinel(list(sentinels), master)
            }
            (None, None) => {
                let (name, urls) = ["LOCK_REDIS_URL", "REDIS_URL"]
                    .into_iter()
                    .find_map(|n| var(n).map(|u| (n, u)))
                    .unwrap_or(("the built-in default", "redis://127.0.0.1:6379".to_owned()));
                let urls = list(urls);
                if urls.is_empty() {
                    return Err(bad(name, "no URL in it".to_owned()));
                }
                Self::default().urls(urls)
            }
        };
        if let Some(n) = var("LOCK_REDIS_REPLICAS") {
            let n = n.trim().parse::<usize>().map_err(|_| {
                bad(
                    "LOCK_REDIS_REPLICAS",
                    format!("`{n}` is not a number of replicas"),
                )
            })?;
            builder = builder.replicas(n);
        }
        Ok(builder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::builder::Target;

    fn from(vars: &[(&str, &str)]) -> Result<LockerBuilder, LockError> {
        LockerBuilder::from_vars(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn the_source_is_the_variable_the_deployment_came_from() {
        let source = |vars: &[(&str, &str)]| {
            LockerBuilder::source_of(|name| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            })
        };
        assert!(source(&[]).starts_with("the built-in default"));
        assert_eq!(
            source(&[("REDIS_URL", "r"), ("LOCK_REDIS_URL", "l")]),
            "LOCK_REDIS_URL"
        );
        assert_eq!(
            source(&[("REDIS_URL", "r"), ("LOCK_REDIS_REPLICAS", "1")]),
            "REDIS_URL"
        );
        assert_eq!(
            source(&[("LOCK_REDIS_SENTINELS", "s"), ("LOCK_REDIS_URL", "l")]),
            "LOCK_REDIS_SENTINELS and LOCK_REDIS_SENTINEL_MASTER"
        );
        assert_eq!(source(&[("LOCK_REDIS_CLUSTER", "c")]), "LOCK_REDIS_CLUSTER");
    }

    #[test]
    fn the_environment_names_one_deployment() {
        let b = from(&[]).unwrap();
        assert!(matches!(&b.deployment, Target::Servers(u) if u == &["redis://127.0.0.1:6379"]));
        let b = from(&[
            ("REDIS_URL", "redis://r:1"),
            ("LOCK_REDIS_URL", "redis://l:1"),
        ])
        .unwrap();
        assert!(matches!(&b.deployment, Target::Servers(u) if u == &["redis://l:1"]));
        let b = from(&[("LOCK_REDIS_URL", "redis://a:1, redis://b:1,redis://c:1")]).unwrap();
        assert!(matches!(&b.deployment, Target::Servers(u) if u.len() == 3));
        let b = from(&[
            ("LOCK_REDIS_CLUSTER", "redis://a:1,redis://b:1"),
            ("LOCK_REDIS_URL", "redis://x:1"),
        ])
        .unwrap();
        assert!(matches!(&b.deployment, Target::Cluster(u) if u.len() == 2));
        let b = from(&[
            ("LOCK_REDIS_SENTINELS", "redis://s:26379"),
            ("LOCK_REDIS_SENTINEL_MASTER", "mymaster"),
            ("LOCK_REDIS_REPLICAS", "1"),
        ])
        .unwrap();
        assert!(matches!(&b.deployment, Target::Sentinel { master, .. } if master == "mymaster"));
        assert_eq!(b.replicas, 1);
    }

    #[test]
    fn a_malformed_environment_names_the_variable() {
        let cases: [(&[(&str, &str)], &str); 3] = [
            (
                &[("LOCK_REDIS_SENTINELS", "redis://s:26379")],
                "LOCK_REDIS_SENTINEL_MASTER",
            ),
            (
                &[
                    ("LOCK_REDIS_CLUSTER", "redis://a:1"),
                    ("LOCK_REDIS_SENTINELS", "redis://s:1"),
                ],
                "both",
            ),
            (&[("LOCK_REDIS_REPLICAS", "two")], "LOCK_REDIS_REPLICAS"),
        ];
        for (vars, expected) in cases {
            let err = from(vars).unwrap_err().to_string();
            assert!(err.contains(expected), "{vars:?}: {err}");
        }
    }
}
