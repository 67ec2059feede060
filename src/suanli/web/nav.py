"""The console's side menu: every page, in the order a user meets them; operator pages only for operators."""

from __future__ import annotations

TENANT: tuple[tuple[str, str, str], ...] = (
    ("/", "Dashboard", "概览"),
    ("/offers", "Offers", "算力市场"),
    ("/run", "Run", "提交任务"),
    ("/workloads", "Workloads", "任务"),
    ("/instances", "Instances", "实例"),
    ("/volumes", "Volumes", "存储卷"),
    ("/hub", "Models & datasets", "模型与数据集"),
    ("/endpoints", "Endpoints", "推理服务"),
    ("/wallet", "Wallet", "钱包"),
    ("/keys", "Keys & tokens", "密钥与令牌"),
    ("/team", "Team", "团队"),
)
OPERATOR: tuple[tuple[str, str, str], ...] = (
    ("/ops/cluster", "Cluster", "集群拓扑"),
    ("/ops/nodes", "Nodes", "节点"),
    ("/ops/waste", "Waste", "闲置与浪费"),
    ("/ops/revenue", "Revenue", "收入"),
    ("/ops/orgs", "Orgs & users", "组织与用户"),
    ("/ops/codes", "Top-up codes", "充值码"),
    ("/ops/prices", "Prices & plans", "价格与套餐"),
    ("/ops/quotas", "Quotas", "配额"),
)


def active(current: str, href: str) -> bool:
    return current == href if href == "/" else current == href or current.startswith(href + "/")
