"""A Flower App running programlogic's FedAvg on the digits writers (see ``program``).

``client``: the ClientApp each SuperNode runs, its data hook reading the node's writer;
``server``: the ServerApp, training in a FlowerContext on the SuperLink's nodes;
``program``: the program itself, run in whichever federated context is current.
"""
