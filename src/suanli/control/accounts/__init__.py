"""Accounts: who someone is and what they may do: users, orgs and API tokens, roles, invitations and spend limits,
who may sign up, login throttling, password hashing, users' SSH public keys."""
