"""The SSH gateway's adapter layer (asyncssh): public-key parsing, the host key, and the server that runs shells,
commands, SFTP and port forwards inside an instance's sandbox.

It knows nothing of the database: the control plane hands the server an `Access` (`suanli.ssh.server`) that
decides who may enter which instance and how to enter it (`suanli.control.workloads.ssh_gateway`).
"""
