"""PyTorch's ``torch.nn.modules.rnn`` path (the classes live in ``xgrad.nn.rnn``)."""

from xgrad.nn.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase

__all__ = ["GRU", "GRUCell", "LSTM", "LSTMCell", "RNN", "RNNBase", "RNNCell", "RNNCellBase"]
