package testenv

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// RefuseProduce answers a produce request (in a kfake control function)
// with NOT_LEADER_FOR_PARTITION for every partition it carries: a
// retriable error, after which franz-go fails a record whose own context
// has ended, for sure.
func RefuseProduce(req kmsg.Request) kmsg.Response {
	preq := req.(*kmsg.ProduceRequest)
	resp := preq.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range preq.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = kerr.NotLeaderForPartition.Code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}
