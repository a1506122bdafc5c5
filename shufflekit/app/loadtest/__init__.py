"""`shufflekit loadtest`: simulated users on Locust against a whole deployment, with a report.

`broker` starts a throwaway Mosquitto (TLS, accounts, the shipped ACL), `stack` the services as
processes, `plan` says what each simulated client does in each round, `locustfile` is what
Locust's workers run, `floor` measures the crypto floor, `report` writes JSON and HTML, and
`run` puts it together.
"""
